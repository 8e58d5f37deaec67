"""The stacks: stateful resources (retained on delete) apart from the service."""
