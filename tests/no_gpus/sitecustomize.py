"""Imported first by every Python process that the test suite starts (tests/conftest.py puts this folder on
PYTHONPATH), before any code of the process runs: the GPUs stay hidden in every rank, even under the deepspeed
launcher, which runs under its CPU accelerator where its caller hid them and then sets each rank's
CUDA_VISIBLE_DEVICES to 0..N-1 (DeepSpeed 0.19.8, deepspeed/launcher/launch.py). It stands in for any other
sitecustomize of the Python (Ubuntu's sets apport's crash hook), which the suite's processes do without."""
import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""
