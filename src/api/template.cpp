/* template.cpp — the one C++ file: llama.cpp's chat library behind
 * template.h's C interface. Nothing here throws past the boundary: every
 * entry point catches everything and reports it as text.
 *
 * Map:
 *   ---- helpers ----    errors, strings out, JSON in
 *   ---- lifecycle ----  init + self-test
 *   ---- apply ----      request JSON -> prompt, grammar, triggers, parser
 *   ---- parse ----      generated text -> message; stream diffs
 */
extern "C" {
#include "api/template.h"

#include "base/error.h"
}

#include <common/build-info.h>
#include <common/chat.h>
#include <common/json-schema-to-grammar.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

struct thaw_tmpl {
    common_chat_templates_ptr tmpls;
    std::string source;
    bool jinja;
};

/* ---- helpers ------------------------------------------------------------------ */

static void set_err(char *err, size_t errlen, const char *what, const char *detail)
{
    if (err && errlen)
        snprintf(err, errlen, "%s%s%s", what, detail && *detail ? ": " : "", detail ? detail : "");
}

static char *dup_out(const std::string &s)
{
    char *p = static_cast<char *>(malloc(s.size() + 1));
    if (p)
        memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

/* Runs f (which returns the JSON text of a result) with every exception
 * caught at the C boundary: a malloc'd copy of the text, or NULL with err
 * set to "what: the exception's message". */
template <typename F> static char *json_call(char *err, size_t errlen, const char *what, F &&f)
{
    try {
        char *s = dup_out(f());
        if (!s)
            set_err(err, errlen, "out of memory", nullptr);
        return s;
    } catch (const std::exception &e) {
        set_err(err, errlen, what, e.what());
    } catch (...) {
        set_err(err, errlen, what, "unknown error");
    }
    return nullptr;
}

static common_reasoning_format reasoning_format(const common_json &in)
{
    std::string name = in.contains("reasoning_format") ? in.at("reasoning_format").get<std::string>() : "auto";
    return common_reasoning_format_from_name(name);
}

/* ---- lifecycle ---------------------------------------------------------------- */

/* A template whose rendering and tool-call syntax are known (Hermes/Qwen
 * style): if the library renders it and parses a call back, the headers
 * thaw was compiled with describe the library it runs with. */
static const char *const SELFTEST_TEMPLATE =
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}\n{%- endfor %}\n</tools>\n"
    "Return each call as <tool_call>\n{\"name\": <name>, \"arguments\": <object>}\n</tool_call><|im_end|>\n"
    "{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- if m.content %}{{ m.content }}\n{%- endif %}\n"
    "{%- for tc in m.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";

static bool self_test(std::string &why)
{
    common_chat_templates_ptr t = common_chat_templates_init(nullptr, SELFTEST_TEMPLATE, "<s>", "</s>");
    common_chat_templates_inputs in;
    common_chat_msg m;
    m.role = "user";
    m.content = "weather in Paris?";
    in.messages.push_back(m);
    in.tools.push_back({"get_weather", "Weather of a city",
                        R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"});
    in.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    common_chat_params p = common_chat_templates_apply(t.get(), in);
    if (p.prompt.find("weather in Paris?") == std::string::npos || p.prompt.find("get_weather") == std::string::npos) {
        why = "the rendered prompt lacks the message or the tool";
        return false;
    }
    if (p.grammar.empty()) {
        why = "no grammar for tool_choice required";
        return false;
    }
    common_chat_parser_params pp(p);
    if (!p.parser.empty())
        pp.parser.load(p.parser);
    common_chat_msg out = common_chat_parse(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", false, pp);
    if (out.tool_calls.size() != 1 || out.tool_calls[0].name != "get_weather" ||
        out.tool_calls[0].arguments.find("Paris") == std::string::npos) {
        why = "a known tool call did not parse back";
        return false;
    }
    return true;
}

int thaw_tmpl_new(const struct llama_model *model, const char *override_src, bool use_jinja, struct thaw_tmpl **out,
                  char *err, size_t errlen)
{
    thaw_tmpl *t = nullptr;

    try {
        std::string why;
        if (use_jinja && !self_test(why)) {
            set_err(err, errlen,
                    "llama.cpp's chat library (libllama-common) does not match the headers thaw was built with",
                    why.c_str());
            return THAW_EINVAL;
        }
        t = new thaw_tmpl;
        t->jinja = use_jinja;
        t->tmpls = common_chat_templates_init(model, override_src ? override_src : "");
        t->source = common_chat_templates_source(t->tmpls.get());
        /* render once now: a template that cannot render fails at start-up,
         * not on the first request */
        common_chat_templates_inputs in;
        common_chat_msg m;
        m.role = "user";
        m.content = "hi";
        in.messages.push_back(m);
        in.use_jinja = use_jinja;
        (void)common_chat_templates_apply(t->tmpls.get(), in);
        *out = t;
        return 0;
    } catch (const std::bad_alloc &) {
        delete t;
        return THAW_ENOMEM;
    } catch (const std::exception &e) {
        delete t;
        set_err(err, errlen, "the chat template cannot be used", e.what());
        return THAW_EINVAL;
    } catch (...) {
        delete t;
        set_err(err, errlen, "the chat template cannot be used", "unknown error");
        return THAW_EINVAL;
    }
}

void thaw_tmpl_free(struct thaw_tmpl *t)
{
    delete t;
}

const char *thaw_tmpl_source(const struct thaw_tmpl *t)
{
    return t->source.c_str();
}

bool thaw_tmpl_jinja(const struct thaw_tmpl *t)
{
    return t->jinja;
}

/* ---- apply --------------------------------------------------------------------- */

char *thaw_tmpl_apply(const struct thaw_tmpl *t, const char *inputs_json, char *err, size_t errlen)
{
    return json_call(err, errlen, "the chat template could not render this request", [&] {
        common_json in = common_json::parse(inputs_json);
        common_chat_templates_inputs ci;

        ci.use_jinja = t->jinja;
        ci.messages = common_chat_msgs_parse_oaicompat(in.at("messages"));
        if (in.contains("tools") && !in.at("tools").is_null())
            ci.tools = common_chat_tools_parse_oaicompat(in.at("tools"));
        if (in.contains("tool_choice"))
            ci.tool_choice = common_chat_tool_choice_parse_oaicompat(in.at("tool_choice").get<std::string>());
        if (in.contains("parallel_tool_calls"))
            ci.parallel_tool_calls = in.at("parallel_tool_calls").get<bool>();
        if (in.contains("json_schema") && !in.at("json_schema").is_null())
            ci.json_schema = in.at("json_schema").dump();
        if (in.contains("add_generation_prompt"))
            ci.add_generation_prompt = in.at("add_generation_prompt").get<bool>();
        if (in.contains("continue_final_message"))
            ci.continue_final_message = common_chat_continuation_parse(in.at("continue_final_message"));
        ci.reasoning_format = reasoning_format(in);
        if (in.contains("chat_template_kwargs")) {
            const common_json &kw = in.at("chat_template_kwargs");
            for (const auto &item : kw.items()) {
                ci.chat_template_kwargs[item.key()] = item.value().dump();
                if (item.key() == "enable_thinking" && item.value().is_boolean())
                    ci.enable_thinking = item.value().get<bool>();
            }
        }
        /* a fixed clock: templates that print today's date must render the
         * same prompt for the same conversation, or no turn would ever hit */
        ci.now = std::chrono::system_clock::time_point{};

        common_chat_params p = common_chat_templates_apply(t->tmpls.get(), ci);

        common_json triggers = common_json::array();
        for (const auto &tr : p.grammar_triggers)
            triggers.push_back(
                common_json::object({{"type", (int)tr.type}, {"value", tr.value}, {"token", (int)tr.token}}));
        common_json parser =
            common_json::object({{"format", (int)p.format},
                                 {"generation_prompt", p.generation_prompt},
                                 {"peg", p.parser},
                                 {"reasoning_format", common_reasoning_format_name(ci.reasoning_format)}});
        /* the template's thinking block, for the reasoning budget
         * (budget.h): its start tag and the tags that end it, the first
         * being the one to force */
        common_json thinking = nullptr;
        if (!p.thinking_start_tag.empty() && !p.thinking_end_tags.empty() && !p.thinking_end_tags[0].empty())
            thinking = common_json::object({{"start", p.thinking_start_tag}, {"ends", p.thinking_end_tags}});
        common_json res = common_json::object({{"prompt", p.prompt},
                                               {"thinking", thinking},
                                               {"grammar", p.grammar},
                                               {"grammar_lazy", p.grammar_lazy},
                                               {"triggers", triggers},
                                               {"preserved_tokens", p.preserved_tokens},
                                               {"additional_stops", p.additional_stops},
                                               {"parser", parser}});
        return res.dump();
    });
}

/* ---- parse ---------------------------------------------------------------------- */

char *thaw_tmpl_parse(const char *parser_json, const char *text, bool is_partial, char *err, size_t errlen)
{
    return json_call(err, errlen, "the reply could not be parsed", [&] {
        common_json pj = common_json::parse(parser_json);
        common_chat_parser_params pp;

        pp.format = (common_chat_format)pj.at("format").get<int>();
        pp.generation_prompt = pj.at("generation_prompt").get<std::string>();
        pp.reasoning_format = reasoning_format(pj);
        std::string peg = pj.at("peg").get<std::string>();
        if (!peg.empty())
            pp.parser.load(peg);
        common_chat_msg m = common_chat_parse(text, is_partial, pp);
        m.role = "assistant";
        return m.to_json_oaicompat().dump();
    });
}

static common_chat_msg msg_from_json(const char *s)
{
    common_json arr = common_json::array();
    arr.push_back(common_json::parse(s));
    std::vector<common_chat_msg> v = common_chat_msgs_parse_oaicompat(arr);
    return v.at(0);
}

char *thaw_tmpl_diffs(const char *prev_msg_json, const char *next_msg_json, char *err, size_t errlen)
{
    return json_call(err, errlen, "stream deltas could not be computed", [&] {
        common_chat_msg prev = prev_msg_json ? msg_from_json(prev_msg_json) : common_chat_msg{};
        common_chat_msg next = msg_from_json(next_msg_json);
        /* A partial parse may trim the content's leading white space that
         * the final one keeps (Llama 3.x's parser, when the text turned
         * out not to be a tool call): it cannot be sent any more, but the
         * rest can, rather than failing the diff and losing the tail. */
        size_t ws = next.content.find_first_not_of(" \t\r\n");
        if (!prev.content.empty() && ws != std::string::npos && ws > 0 &&
            next.content.compare(0, prev.content.size(), prev.content) != 0 &&
            next.content.compare(ws, prev.content.size(), prev.content) == 0)
            prev.content = next.content.substr(0, ws) + prev.content;
        common_json out = common_json::array();
        for (const auto &d : common_chat_msg_diff::compute_diffs(prev, next)) {
            common_json o = common_json::object();
            if (!d.content_delta.empty())
                o["content"] = d.content_delta;
            if (!d.reasoning_content_delta.empty())
                o["reasoning_content"] = d.reasoning_content_delta;
            if (d.tool_call_index != std::string::npos) {
                o["tool_call_index"] = (int)d.tool_call_index;
                if (!d.tool_call_delta.name.empty())
                    o["name"] = d.tool_call_delta.name;
                if (!d.tool_call_delta.id.empty())
                    o["id"] = d.tool_call_delta.id;
                o["arguments"] = d.tool_call_delta.arguments;
            }
            out.push_back(o);
        }
        return out.dump();
    });
}

/* ---- samplers ---------------------------------------------------------------------- */

/* Runs f (returning 0 or a THAW_ error) with every exception caught at the
 * C boundary: THAW_EINVAL with err set to "what: the exception's message". */
template <typename F> static int int_call(char *err, size_t errlen, const char *what, F &&f)
{
    try {
        return f();
    } catch (const std::exception &e) {
        set_err(err, errlen, what, e.what());
    } catch (...) {
        set_err(err, errlen, what, "unknown error");
    }
    return THAW_EINVAL;
}

int thaw_tmpl_sampler_accept(struct llama_sampler *smpl, llama_token tok, char *err, size_t errlen)
{
    return int_call(err, errlen, "the grammar rejected a token", [&] {
        llama_sampler_accept(smpl, tok);
        return 0;
    });
}

int thaw_tmpl_sampler_sample(struct llama_sampler *smpl, struct llama_context *ctx, int idx, llama_token *out,
                             char *err, size_t errlen)
{
    return int_call(err, errlen, "sampling failed", [&] {
        *out = llama_sampler_sample(smpl, ctx, idx);
        return 0;
    });
}

int thaw_tmpl_sampler_sample_cur(struct llama_sampler *smpl, struct llama_context *ctx, int idx, llama_token_data *buf,
                                 int n_vocab, llama_token_data_array *cur, char *err, size_t errlen)
{
    return int_call(err, errlen, "sampling failed", [&] {
        const float *logits = llama_get_logits_ith(ctx, idx);
        if (!logits) {
            set_err(err, errlen, "sampling failed", "no logits at that row");
            return (int)THAW_EINVAL;
        }
        for (llama_token t = 0; t < n_vocab; t++)
            buf[t] = llama_token_data{t, logits[t], 0.0f};
        *cur = llama_token_data_array{buf, (size_t)n_vocab, -1, false};
        llama_sampler_apply(smpl, cur);
        if (cur->selected < 0 || cur->selected >= (int64_t)cur->size) {
            set_err(err, errlen, "sampling failed", "the sampler chain selected no token");
            return (int)THAW_EINVAL;
        }
        llama_sampler_accept(smpl, cur->data[cur->selected].id);
        return 0;
    });
}

/* ---- build ------------------------------------------------------------------- */

const char *thaw_tmpl_build_fingerprint(void)
{
    return llama_build_info(); /* what llama-server sends: "b<number>-<commit>" */
}

/* ---- schemas ------------------------------------------------------------------ */

char *thaw_tmpl_schema_grammar(const char *schema_json, char *err, size_t errlen)
{
    return json_call(err, errlen, "the JSON schema cannot be turned into a grammar",
                     [&] { return json_schema_to_grammar(common_json::parse(schema_json)); });
}
