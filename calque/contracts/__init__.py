"""Pydantic models that cross a process boundary. No boto3 here."""
