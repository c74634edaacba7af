"""Federated methods, one module each. A method registers itself with ``@register_method`` (its name and
the schema of its ``params``, :mod:`fedrepro.registry`); the class implements
:class:`fedrepro.fl.method.FederatedMethod`."""
