"""The report rendered for people and tools: Markdown, HTML with its charts, CSV and JSON."""
