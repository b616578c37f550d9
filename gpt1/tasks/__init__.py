"""Fine-tuning tasks: readers for each dataset format, the paper's four input transformations,
the task kinds and registry, and GLUE-style metrics."""
