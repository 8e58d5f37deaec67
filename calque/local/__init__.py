"""The embedded local control plane (``calque local up``): the deployed handlers over
local stand-ins. See docs/local-plane.md for what each stand-in does and how honestly."""
