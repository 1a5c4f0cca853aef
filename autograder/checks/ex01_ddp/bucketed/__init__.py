"""Exercise 1's part 2, DDP by hand (``BucketedDDP``): its probes, observations, causes and criteria."""
