"""A validated chat request in, what the engine runs out: the prompt ids (the chat template with the tools, natively
or as a system text) and the constraint of its output (a required tool call, or a response_format)."""

from __future__ import annotations

from xgrad_llm.generate import LLM
from xgrad_llm.server.constrain import JSONConstraint, tool_call_node
from xgrad_llm.server.protocol import ChatRequest
from xgrad_llm.server.tools import THINK_OPEN, tool_messages, tool_prompt


def chat_constraint(llm: LLM, req: ChatRequest) -> JSONConstraint | None:
    """The JSON constraint of a request: a required or named tool call, or its response_format (None: free text)."""
    if req.tools and (req.tool_choice == "required" or isinstance(req.tool_choice, dict)):
        names = [t["function"]["name"] for t in req.tools]
        if isinstance(req.tool_choice, dict):
            names = [req.tool_choice["function"]["name"]]
        params = {t["function"]["name"]: t["function"].get("parameters", {}) for t in req.tools}
        node = tool_call_node({n: params[n] for n in names})
        return JSONConstraint(llm.tokenizer, node, prefix="<tool_call>\n", suffix="\n</tool_call>")
    if req.response_format is not None:
        fmt_schema = req.response_format.get("schema") if req.response_format["type"] == "json_schema" else None
        return JSONConstraint(llm.tokenizer, fmt_schema, root_object=fmt_schema is None)
    return None


def chat_prompt(llm: LLM, req: ChatRequest) -> tuple[list[int], bool]:
    """(prompt ids, whether the reply starts inside a <think> block)."""
    messages, tools = req.messages, req.tools if req.tool_choice != "none" else []
    native = "tools" in llm.template.source
    if tools and not native:
        messages = tool_messages(messages)
        text = tool_prompt(tools, req.tool_choice)
        if messages[0]["role"] == "system":
            messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": text}, *messages]
    elif not native:
        messages = tool_messages(messages)
    prompt_text = llm.template.render(messages, add_generation_prompt=True, tools=tools or None)
    thinking = prompt_text.rstrip().endswith(THINK_OPEN)
    return llm.encode(prompt_text), thinking
