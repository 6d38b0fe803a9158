"""Records (docs/design.md section 5): loading with validation, and converters that keep counts."""

from .jsonl import Problem
from .records import LoadResult, Record, read_records, records_from_rows, validate_file

__all__ = ["LoadResult", "Problem", "Record", "read_records", "records_from_rows", "validate_file"]
