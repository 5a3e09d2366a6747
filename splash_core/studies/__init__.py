"""Offline studies behind CLI commands: the paper's fixed-layout sweeps predicted, the deployment
simulator, KV residency (appendix B), the illustrative timing law (Eq 11-12) and calibration of θ."""
