"""The grading process: which exercises exist, the launches, the verdicts and the feedback."""
