"""`contextd proxy`: an HTTP proxy in front of the OpenAI and Anthropic APIs that gives an
unchanged SDK contextd's views (`app` for the flow, `dialects` for the three APIs, `ledger`
for keeping a session equal to the conversation the SDK resends).

Imported only by the `proxy` command: `contextd serve` never loads it."""

OPENAI = "https://api.openai.com"
"""The OpenAI upstream unless `--openai-upstream` names another."""
ANTHROPIC = "https://api.anthropic.com"
"""The Anthropic upstream unless `--anthropic-upstream` names another."""
