"""Dataset declarations, one module per imaging modality (brain MRI, skin, head CT, chest X-ray,
fundus, endoscopy, office objects, the offline demo sets), imported when the registry is first used;
each declares its datasets with ``register_dataset(DatasetSpec(...))`` and their preparers with
``@preparer`` (:mod:`fedrepro.registry`)."""
