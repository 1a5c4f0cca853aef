"""Exercise 4's first part: ZeRO-1 by hand (Rajbhandari et al., 2020, stage 1)."""
