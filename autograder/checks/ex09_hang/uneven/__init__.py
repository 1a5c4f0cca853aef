"""Exercise 9's part 2, ranks with uneven numbers of batches (``train_uneven``): its probes, observations, causes
and criteria."""
