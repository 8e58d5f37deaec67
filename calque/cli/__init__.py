"""The ``calque`` command line: argparse commands (calque/cli/commands/), the SigV4-signed
API client (client.py), output helpers (output.py) and duration parsing (durations.py)."""
