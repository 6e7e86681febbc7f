"""Chat datasets formatted for training: token ids, masks, packing, rejects and a report, at scale.

``format_dataset`` reads JSONL, JSON or Parquet (or a folder of them) in OpenAI, ShareGPT or
prompt/completion form, and writes Parquet with ``input_ids``, ``attention_mask``, ``assistant_masks``
(or ``labels``), ``num_tokens`` and each row's ``id``; on worker processes or on Ray Data. ``Formatter``
is the same formatting as a batched function for Hugging Face ``datasets.Dataset.map``.

>>> from chatcodec.dataset import Formatter
>>> fmt = Formatter("../shared/tokenizers/qwen3", reasoning=False)  # doctest: +SKIP
>>> chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
>>> fmt({"messages": [chat]})["num_tokens"]  # doctest: +SKIP
[15]
"""

from .formatting import REASONS as REASONS
from .formatting import FormatOptions as FormatOptions
from .formatting import Formatted as Formatted
from .formatting import Formatter as Formatter
from .formatting import Rejected as Rejected
from .jobs import format_dataset as format_dataset
from .packing import best_fit_decreasing as best_fit_decreasing
from .report import read_summary as read_summary
from .rows import SHAREGPT_ROLES as SHAREGPT_ROLES
from .summary import Summary as Summary

__all__ = [
    "REASONS",
    "SHAREGPT_ROLES",
    "FormatOptions",
    "Formatted",
    "Formatter",
    "Rejected",
    "Summary",
    "best_fit_decreasing",
    "format_dataset",
    "read_summary",
]
