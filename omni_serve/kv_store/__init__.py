"""The tiered store of KV prefixes (host memory, then local disk) that conversations' turns
resume from: found by the session's id or by the prompt's content (a chain of block hashes),
loaded by the Thinker through the channel KV connector."""
