"""The deployable CDK app: one construct per capability, two stacks that compose them.

Everything here is built from calque/resources.py (tables, functions, queues,
schedules) and makes no AWS call at synth time.
"""
