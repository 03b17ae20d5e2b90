"""Files gradleak reads and writes: every input and output path checked before any work, outputs
written atomically (staged and renamed), so a failure never leaves half a file. One module per
job (checks, atomic, signals, staging, bounded); this package names their public API."""

from ..errors import InputFileError
from .atomic import atomic_write_bytes, atomic_write_files, umask_mode
from .bounded import MAX_JSON_DEPTH, check_tree, loads_json, one_line, printable
from .checks import (MAX_TEXT_FILE, check_apart, check_distinct, check_input_file, check_name_lengths, check_output_dir,
                     check_output_file, name_max, read_text_file, run_inputs, short_name)
from .signals import deferred_signals
from .staging import HOST, OutputAppearedError, StagedDir, process_alive, remove_stale_partials

__all__ = ["InputFileError", "check_input_file", "read_text_file", "check_output_file", "check_output_dir",
           "check_distinct", "check_apart", "run_inputs", "atomic_write_bytes", "atomic_write_files", "deferred_signals",
           "StagedDir", "OutputAppearedError", "remove_stale_partials", "check_name_lengths", "name_max", "short_name",
           "MAX_TEXT_FILE", "MAX_JSON_DEPTH", "one_line", "check_tree", "loads_json", "printable", "HOST",
           "process_alive", "umask_mode"]
