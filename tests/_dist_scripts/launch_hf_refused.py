"""What docs/torch-backend.md#launchers says Hugging Face refuses, checked as a rank started by
torchrun sees it (``LOCAL_RANK`` set): ``TrainingArguments(ddp_backend="homagg")`` and the command
line's ``--ddp_backend homagg``.  Prints one line per way: ``REFUSED <message>`` or ``ACCEPTED``."""

from transformers import HfArgumentParser, TrainingArguments

try:
    TrainingArguments(output_dir="refused-out", ddp_backend="homagg", use_cpu=True, report_to=[])
    print("ACCEPTED", flush=True)
except ValueError as exc:
    print(f"REFUSED {exc}", flush=True)
try:
    HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", "refused-out", "--ddp_backend", "homagg", "--use_cpu"])
    print("ACCEPTED", flush=True)
except SystemExit:  # argparse: the error is on stderr
    print("REFUSED by the command line", flush=True)
