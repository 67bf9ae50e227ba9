"""What a notebook kernel needs around the lab: the set-up every notebook runs first, the chip's
hand-over between kernels, the warm start of the compilation cache, and the working copies
``make lab`` serves."""
