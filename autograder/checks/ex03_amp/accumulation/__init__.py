"""Exercise 3's second part: accumulated_step, float16 with a GradScaler over K micro-batches."""
