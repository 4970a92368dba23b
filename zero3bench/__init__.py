"""
The benchmark's library, behind the scripts that users run (train_gpt.py, report.py, plan.py, run.sh): the
command line and its checks (options, config_checks, launches), the stages' table (stages), the stack's
features and workarounds (compat, machine, fsdp2), a rank's record (result), and what measures, predicts,
reports and plans (accounting, reporting, planning). docs/layout.md walks through it.
"""
