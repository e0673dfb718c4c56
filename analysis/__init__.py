"""analysis: archlab's analysis of recipes and run folders."""

from archlab.quiet import quiet_third_party

quiet_third_party()  # DeepSpeed's "Setting accelerator to CPU" warning kept out of the output
