"""What ``splash serve`` reads and checks before anything starts: the chat template (given, beside
the tokenizer as transformers 5 writes it, or in tokenizer_config.json), the checkpoint's sampling
defaults (generation_config.json), the served model's name, and the flags that fail in one line
with exit 2 before any rank starts or anything loads (--port out of range or in use, bad CORS
origins, an unreadable template)."""

from __future__ import annotations

import json
import math
import shutil
import socket

import pytest

from splash_core.checkpoint.generation_config import sampling_defaults
from splash_core.checkpoint.tiny import ensure
from splash_core.checkpoint.tokenizer import Tokenizer
from splash_core.cli import serve
from splash_core.cli.main import main
from splash_core.profiles.checkpoint_config import CheckpointError

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def folder(tmp_path):
    """The tiny checkpoint's small files (no weights): a folder to add templates and configs to."""
    source = ensure("tiny-deepseek-v3")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(f"{source}/{name}", tmp_path / name)
    return tmp_path


def _config(folder, **changes):
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_the_chat_template_comes_from_the_flag_then_the_jinja_file_then_tokenizer_config(folder):
    assert Tokenizer(folder).render_chat(MESSAGES).endswith("<｜User｜>hi<｜Assistant｜>")  # tokenizer_config.json's
    _config(folder, chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}])
    assert Tokenizer(folder).render_chat(MESSAGES) == "D"  # named templates: the default one
    (folder / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")  # transformers 5 writes it here
    tokenizer = Tokenizer(folder)
    assert tokenizer.render_chat(MESSAGES) == "Jhi" and tokenizer.chat_template_source.endswith("chat_template.jinja")
    given = Tokenizer(folder, chat_template="G{{ messages | length }}", chat_template_source="mine.jinja")
    assert given.render_chat(MESSAGES) == "G1" and given.chat_template_source == "mine.jinja"
    (folder / "chat_template.jinja").unlink()
    _config(folder, chat_template=None)
    with pytest.raises(CheckpointError, match="chat_template.jinja: missing"):
        Tokenizer(folder).render_chat(MESSAGES)


def test_template_kwargs_reach_the_template_but_cannot_replace_the_messages(folder):
    template = "{% if enable_thinking %}<think>{% endif %}{{ messages[0]['content'] }}{{ bos_token }}"
    tokenizer = Tokenizer(folder, chat_template=template)
    assert tokenizer.render_chat(MESSAGES) == "hi<｜begin▁of▁sentence｜>"
    assert tokenizer.render_chat(MESSAGES, enable_thinking=True) == "<think>hi<｜begin▁of▁sentence｜>"
    assert tokenizer.render_chat(MESSAGES, bos_token="") == "hi"  # as transformers lets kwargs override tokens
    request_kwargs = {"add_generation_prompt": False, "enable_thinking": 1}  # a request may set either
    assert tokenizer.render_chat(MESSAGES, **request_kwargs).startswith("<think>")
    with pytest.raises(ValueError, match="messages cannot be set as a template variable"):
        tokenizer.render_chat(MESSAGES, messages=[])


def test_templates_render_as_transformers_renders_them(folder):
    from transformers import PreTrainedTokenizerFast

    template = ("{% for m in messages %}{{ m | tojson }}{% generation %}<{{ m['content'] }}>{% endgeneration %}"
                "{% endfor %}{{ strftime_now('%Y') | length }}")
    (folder / "chat_template.jinja").write_text(template)
    messages = [{"role": "user", "content": "é & <b>"}]
    ours = Tokenizer(folder).render_chat(messages)
    assert ours == PreTrainedTokenizerFast.from_pretrained(folder).apply_chat_template(messages, tokenize=False)
    assert ours.startswith('{"role": "user", "content": "é & <b>"}<é & <b>>4')


def test_a_template_that_does_not_parse_fails_at_start_naming_where_it_came_from(folder):
    (folder / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(CheckpointError, match=r"chat_template\.jinja: \(template\): does not parse: line 1"):
        Tokenizer(folder)


def test_sampling_defaults_are_generation_configs_fields_under_the_requests_names(folder):
    path = folder / "generation_config.json"
    assert sampling_defaults(folder) == {}  # the tiny checkpoint's has only token ids
    path.write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                "repetition_penalty": 1.1, "max_new_tokens": 64, "eos_token_id": 1}))
    assert sampling_defaults(folder) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1,
                                         "max_tokens": 64}
    path.unlink()
    assert sampling_defaults(folder) == {}


@pytest.mark.parametrize("field, value", [("temperature", math.nan), ("temperature", math.inf), ("top_p", 0),
                                          ("top_p", "0.9"), ("top_k", 2.5), ("min_p", 1.5), ("max_new_tokens", True),
                                          ("repetition_penalty", -1.0)])
def test_a_sampling_default_out_of_range_stops_the_server_naming_the_field(folder, field, value):
    (folder / "generation_config.json").write_text(json.dumps({field: value}))  # json writes NaN and Infinity
    with pytest.raises(CheckpointError, match=f"generation_config.json: {field}: expected"):
        sampling_defaults(folder)


def test_the_served_name_is_the_checkpoints_not_its_path(tmp_path, monkeypatch):
    assert serve.model_name(str(tmp_path / "DeepSeek-V3") + "/") == "DeepSeek-V3"
    (tmp_path / "weights-v2").mkdir()
    (tmp_path / "dsv3").symlink_to(tmp_path / "weights-v2")
    monkeypatch.chdir(tmp_path)
    assert serve.model_name("dsv3/.") == serve.model_name(str(tmp_path / "dsv3")) == "dsv3"  # the link's name, as given
    snapshot = tmp_path / "hub" / "models--deepseek-ai--DeepSeek-V3" / "snapshots" / "0123abc"
    assert serve.model_name(str(snapshot)) == "deepseek-ai/DeepSeek-V3"  # the Hugging Face cache's layout


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if ``splash serve`` gets as far as resolving its deployment."""
    def loaded(args):
        raise AssertionError("the deployment was resolved before the flags were checked")
    monkeypatch.setattr(serve, "deployment_for", loaded)


@pytest.mark.parametrize("flag, value, message", [
    ("--port", "70000", "argument --port: must be a port number, 0 to 65535 (got 70000)"),
    ("--port", "-1", "argument --port: must be >= 0 (got -1)"),
    ("--allowed-origins", "ftp://x.org", "argument --allowed-origins: 'ftp://x.org' is not an origin"),
    ("--allowed-origins", "https://a.org/path", "argument --allowed-origins: 'https://a.org/path' is not an origin"),
    ("--allowed-origins", ",", "argument --allowed-origins: expected * or one or more origins"),
    ("--max-body-bytes", "0", "argument --max-body-bytes: must be >= 1"),
    ("--log-stats-interval", "nan", "argument --log-stats-interval:"),
])
def test_a_bad_flag_is_one_line_and_exit_2_before_anything_loads(nothing_loads, capsys, flag, value, message):
    assert main(["serve", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splash serve: error: " + message) and err.count("\n") == 1, err


def test_a_port_in_use_is_one_line_and_exit_2_before_anything_loads(nothing_loads, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"splash serve: error: --port {port}: cannot listen on 127.0.0.1:{port}: ")
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("flags, message", [
    (["--chat-template", "/no/such.jinja"], "--chat-template /no/such.jinja: cannot read: No such file or directory"),
    (["--max-prompt-tokens", "512"], "--max-prompt-tokens 512: must be below the context length (512 tokens)"),
])
def test_what_the_checkpoint_cannot_take_is_one_line_and_exit_2(capsys, flags, message):
    assert main(["serve", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("splash serve: error: " + message) and err.count("\n") == 1, err
