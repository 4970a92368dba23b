"""plan.py's parts: its inputs checked and calibrated (inputs), and its tables and plot (output)."""
