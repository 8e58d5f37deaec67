"""Simulators that replay traces through the real placement and scaling code with a virtual clock."""
