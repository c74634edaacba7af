"""The sections of a MIMIC-CXR free-text report, by the dataset's own rules: MIT-LCP's ``create_section_files.py``
and ``section_parser.py`` (MIT-LCP/mimic-cxr, ``txt/``), which MGCA copies into ``mgca/preprocess/utils.py``
(HKU-MedAI/MGCA) to write the ``mimic_cxr_sectioned.csv`` that MGCA and FedDRA (BioMed-AI-Lab-U-Michgan/TMLR_FedDRA)
read their impression and findings from. This is our own implementation of those rules:

1. A heading is a line that starts with one space followed by capitals, spaces and ``( ) / , -`` and a colon,
   then a whitespace character (``"\\n FINDINGS: ..."``). Text before the first heading is the ``preamble``; a
   report without a heading is one section, ``full report``. A section runs from the end of its heading to the
   next heading, which is looked for only from the end of the line the section starts on.
2. Heading names are lower-cased and normalised: a table of known variants (``conclusion`` and ``findings and
   impression`` count as the impression, ``comparisons`` as the comparison, misspellings such as ``impresson``
   ...), else the first of impression, findings, history, comparison, addendum that the name contains, else
   ``findings`` where it names a view (``chest``, ``pa and lateral``, ``portable`` ...).
3. Empty impression and findings sections are dropped; a report with neither gets a ``last_paragraph``: the
   paragraphs of its last section after the first.
4. A study's impression (findings) is its *last* section of that name. The studies MIT-LCP sections by hand
   (:data:`HAND_SECTIONED`: a custom slice or section name) have no row in the sectioned table, so MGCA, and
   hence FedDRA, has no text for them.
"""

from __future__ import annotations

import re

HEADING = re.compile(r"\n ([A-Z ()/,-]+):\s")

# heading (lower-cased) -> section
KNOWN_HEADINGS = {
    **dict.fromkeys(("preamble", "impression", "comparison", "indication", "findings", "examination", "technique",
                     "history", "notification", "addendum", "date", "comment", "wet read", "recommendations"), None),
    "comparisons": "comparison", "reference exam": "comparison", "comparison exam": "comparison",
    "comparison film": "comparison", "comparision": "comparison", "comparsion": "comparison",
    "comparrison": "comparison", "comparisions": "comparison",
    "clinical history": "history", "clinical information": "history", "patient history": "history", "pfi": "history",
    "reason for examination": "indication", "reason for exam": "indication", "clinical indication": "indication",
    "idication": "indication",
    "exam": "examination", "type of examination": "examination",
    "conclusion": "impression", "findings and impression": "impression", "findings/impression": "impression",
    "findings/ impression": "impression", "ndication": "impression", "impresson": "impression",
    "imprression": "impression", "imoression": "impression", "impressoin": "impression", "imprssion": "impression",
    "impresion": "impression", "imperssion": "impression", "mpression": "impression", "impession": "impression",
    "chest, two views": "findings", "finding": "findings", "findins": "findings", "findindgs": "findings",
    "findgings": "findings", "findngs": "findings", "findnings": "findings", "finidngs": "findings",
    "reference findings": "findings",
    "recommendation(s)": "recommendations", "recommendation": "recommendations", "wetread": "wet read",
}
MAIN_SECTIONS = ("impression", "findings", "history", "comparison", "addendum")
VIEW_WORDS = re.compile("chest|portable|pa and lateral|lateral and pa|ap and lateral|lateral and ap|frontal and|"
                        "two views|frontal view|pa view|ap view|one view|lateral view|bone window|frontal upright|"
                        "frontal semi-upright|ribs|pa and lat")

# studies MIT-LCP sections by hand (create_section_files.py's custom rules): none of them is in the sectioned table
HAND_SECTIONED = frozenset(f"s{n}" for n in (
    50913680, 59363654, 59279892, 59768032, 57936451, 50058765, 53356173, 53202765, 50808053, 51966317, 50743547,
    56451190, 59067458, 59215320, 55124749, 54365831, 59087630, 58157373, 56482935, 58375018, 54654948, 55157853,
    51491012, 50525523, 57564132, 59982525, 53488209, 54875119, 50196495, 56579911, 52648681, 59889364, 53514462,
    59505494, 53182247, 51410602, 56412866, 54986978, 59003148, 57150433, 56760320, 59562049, 52674888, 55258338,
    59330497, 52119491, 58235663, 50798377, 54168089, 53071062, 56724958, 54231141, 53607029, 52035334))


def section_name(heading: str) -> str:
    name = heading.lower().strip()
    if name in KNOWN_HEADINGS:
        return KNOWN_HEADINGS[name] or name
    main = next((m for m in MAIN_SECTIONS if m in name), None)
    if main:
        return main
    return "findings" if VIEW_WORDS.search(name) else name


def split_sections(text: str) -> list[tuple[str, str]]:
    """(normalised name, text) of every section of a report, in order (rules 1-3 above)."""
    match = HEADING.search(text)
    if match is None:
        sections = [("full report", text)]
    else:
        sections = [("preamble", text[:match.start(1)])]
        while match:
            name, start = match.group(1), match.end()
            line_end = text.find("\n", start)
            match = HEADING.search(text, line_end if line_end >= 0 else start)
            sections.append((name, text[start:match.start() if match else len(text)]))
        sections = [(section_name(name), body) if i else (name, body) for i, (name, body) in enumerate(sections)]
    sections = [(n, b) for n, b in sections if not (n in ("impression", "findings") and not b.strip())]
    names = {n for n, _ in sections}
    if "impression" not in names and "findings" not in names and "\n \n" in sections[-1][1]:
        name, body = sections[-1]
        first, *rest = body.split("\n \n")
        sections[-1] = (name, first)
        sections.append(("last_paragraph", "\n \n".join(rest)))
    return sections


def report_sections(text: str, study: str | None = None) -> dict[str, str]:
    """Section name -> stripped text of the last section of that name, as the sectioned table holds a study's
    report (``impression``, ``findings``, ``last_paragraph``, ``comparison``, and the others); ``{}`` for a study
    MIT-LCP sections by hand (``study``: ``s<study id>``), which the table leaves out."""
    if study is not None and study in HAND_SECTIONED:
        return {}
    return {name: body.strip() for name, body in split_sections(text)}
