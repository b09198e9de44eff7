"""SLO report exports: fetch, render (Markdown, HTML, PDF, CSV, JSON), write and schedule."""
