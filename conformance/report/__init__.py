"""Reporting: what a check found, as text, JSON, JUnit and Markdown, and the report files.

Owns: rendering a report (``render``) and writing report files as a run goes (``files``).

May import: run.
"""
