"""What is sent: prompt sets and conversations, read from the built-in workloads or the user's
files (JSONL, ShareGPT, Hugging Face exports, ...), into ``records.Prompt``. No HTTP, no servers."""
