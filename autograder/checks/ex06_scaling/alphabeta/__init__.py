"""Exercise 6's second part: the α-β model of the ring all-reduce, fitted and used to predict."""
