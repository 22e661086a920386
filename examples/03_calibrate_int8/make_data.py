"""Write calib.npz: 32 seeded samples for the input `input`, shape [32, 3, 32, 32].

One .npz keyed by input name, with a leading sample axis, is one of the forms
`graphfix calibrate --data`, `run --data` and `check --data` read. Real calibration data
would be a few hundred preprocessed images; smooth random images stand in for them here.
"""

import numpy as np

rng = np.random.default_rng(0)
noise = rng.standard_normal((32, 3, 8, 8)).astype(np.float32)
# Upsample 8x8 noise to 32x32 so neighbouring pixels are correlated, as in images.
images = noise.repeat(4, axis=2).repeat(4, axis=3)
images += 0.1 * rng.standard_normal(images.shape).astype(np.float32)
np.savez("calib.npz", input=images)
print(f"wrote calib.npz: input {images.dtype}{list(images.shape)}")
