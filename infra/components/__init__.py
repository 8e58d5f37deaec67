"""One construct per capability, each with keyword-only typed props.

Constructs don't know each other: the stacks compose them and do the grants.
"""
