"""contextd behind the agent frameworks' own extension points, one module per framework,
each an optional extra of this package (``pip install "contextd-client[langchain]"``):

- `contextd_client.integrations.langchain`: a LangChain v1 / LangGraph agent middleware;
- `contextd_client.integrations.pydantic_ai`: a pydantic-ai history processor;
- `contextd_client.integrations.openai_agents`: an OpenAI Agents SDK session and input filter;
- `contextd_client.integrations.strands`: a Strands Agents session and conversation manager.

Importing this package imports no framework; each module imports its own.
"""
