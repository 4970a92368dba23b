"""
The report of a results folder, in parts that scripts import one by one; report.py is its command line.

    reading    the ranks' results from a folder's logs (result.RankResult), and what each run says
    deaths     which rank ended first, in each launcher's words
    verdict    the criteria, each judged apart from the sentence that tells it (CRITERIA)
    figures    what each criterion judged, a frozen dataclass each, and a verdict line (Check)
    bounds     the verdict's tolerances, and what two compared runs must agree on
    tables     the runs side by side (COMPARISON), and the lines that describe without judging
    artifacts  summary.json, summary.md and memory.png
    compare    what moved between two folders
"""
