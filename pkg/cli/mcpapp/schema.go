package mcpapp

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/fleetd/fleet/pkg/fault"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Grammars the gateway holds names to, as JSON Schema patterns (RE2 and
// ECMA-262 agree on these).
const (
	namePattern = `^[A-Za-z][A-Za-z0-9_-]{0,63}$` // ident.NamePattern: entities and groups
	hostPattern = `^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`
	maxAddress  = 200 // NAME@HOST (64+1+63) or a gid (63+1+36), with room
	maxID       = 128 // msg, ask, trace and request ids
)

// A prop is what a tool says about one input property beyond its type
// and description: its bounds and its default, shown to the model in the
// input schema and enforced by call before the handler runs.
type prop struct {
	min, max       *float64
	minLen, maxLen *int
	pattern        string
	enum           []any
	def            any
	items          *prop // an array's items
}

func intRange(lo, hi int) prop {
	l, h := float64(lo), float64(hi)
	return prop{min: &l, max: &h}
}

func (p prop) withDefault(v any) prop { p.def = v; return p }

func text(lo, hi int) prop { return prop{minLen: &lo, maxLen: &hi} }

func pattern(re string, hi int) prop {
	lo := 1
	return prop{minLen: &lo, maxLen: &hi, pattern: re}
}

func (p prop) apply(s *jsonschema.Schema) {
	s.Minimum, s.Maximum, s.MinLength, s.MaxLength, s.Pattern = p.min, p.max, p.minLen, p.maxLen, p.pattern
	if p.enum != nil {
		s.Enum = p.enum
	}
	if p.def != nil {
		s.Default, _ = json.Marshal(p.def)
	}
	if p.items != nil && s.Items != nil {
		p.items.apply(s.Items)
	}
}

// check is the friendly half of validation: the message names the
// argument and its bounds as the tool's description does.
func (p prop) check(name string, v any) error {
	bad := func(format string, a ...any) error {
		return fault.New(fault.Usage, fault.KindUsage, format, a...)
	}
	switch v := v.(type) {
	case float64:
		if p.min != nil && p.max != nil && (v < *p.min || v > *p.max) {
			return bad("%s must be from %v to %v, not %v", name, *p.min, *p.max, v)
		}
	case string:
		n := utf8.RuneCountInString(v)
		if p.minLen != nil && n < *p.minLen {
			if *p.minLen == 1 {
				return bad("%s is empty", name)
			}
			return bad("%s must be at least %d characters", name, *p.minLen)
		}
		if p.maxLen != nil && n > *p.maxLen {
			return bad("%s is %d characters, over its limit of %d", name, n, *p.maxLen)
		}
		if p.pattern == namePattern && !regexp.MustCompile(p.pattern).MatchString(v) {
			// in words, as the commands say it
			return bad("%s %q is not a valid name (a letter, then up to 63 letters, digits, '-' or '_')", name, v)
		}
		if p.pattern != "" && !regexp.MustCompile(p.pattern).MatchString(v) {
			return bad("%s %q does not match %s", name, v, p.pattern)
		}
		if p.enum != nil {
			for _, e := range p.enum {
				if e == v {
					return nil
				}
			}
			return bad("%s must be one of %v, not %q", name, p.enum, v)
		}
	case []any:
		if p.items != nil {
			for i, e := range v {
				if err := p.items.check(fmt.Sprintf("%s[%d]", name, i), e); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// toolDef is one tool: what the client lists (name, title, description,
// annotations) and the bounds of its input properties.
type toolDef struct {
	tool  *mcp.Tool
	props map[string]prop
}

func yes() *bool { t := true; return &t }
func no() *bool  { f := false; return &f }

// Annotations, by what a tool does to the fleet. None reaches outside the
// fleet (openWorldHint false): its world is the entities of the trusted
// hosts.
func readOnly(title string) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{Title: title, ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: no()}
}

func additive(title string, idempotent bool) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{Title: title, DestructiveHint: no(), IdempotentHint: idempotent, OpenWorldHint: no()}
}

func destructive(title string, idempotent bool) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{Title: title, DestructiveHint: yes(), IdempotentHint: idempotent, OpenWorldHint: no()}
}

// addTool adds a typed tool. Its input schema is inferred from In, with
// d's bounds and defaults added; its output schema from Out. Unlike
// mcp.AddTool it validates the arguments itself, so that a bad one is a
// tool error in the form every other one has ("usage (64): ..."), and a
// result is the structured output and the same JSON as text (for clients
// that show only content).
//
// The inference writes a slice or pointer field as "null or
// array/object", which tool-schema dialects with one type per field
// (OpenAPI's, some model providers') reject or misread. These tools never
// send null (slices are made empty, pointers are omitted), so the plain
// type is the honest schema.
func addTool[In, Out any](s *mcp.Server, d toolDef, h mcp.ToolHandlerFor[In, Out]) {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(err)
	}
	out, err := jsonschema.For[Out](nil)
	if err != nil {
		panic(err)
	}
	in, out = notNull(in), notNull(out)
	for name, p := range d.props {
		ps := in.Properties[name]
		if ps == nil {
			panic(fmt.Sprintf("tool %s: no input property %s", d.tool.Name, name))
		}
		p.apply(ps)
	}
	resolved, err := in.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: %v", d.tool.Name, err))
	}
	t := d.tool
	t.InputSchema, t.OutputSchema = in, out
	if t.Title == "" && t.Annotations != nil {
		t.Title = t.Annotations.Title
	}
	s.AddTool(t, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		input, err := checkArgs(req.Params.Arguments, d.props, resolved)
		if err != nil {
			return errResult(toolError(err, "")), nil
		}
		var v In
		if err := json.Unmarshal(input, &v); err != nil {
			return errResult(toolError(fault.New(fault.Usage, fault.KindUsage, "arguments: %v", err), "")), nil
		}
		res, o, err := h(ctx, req, v)
		if err != nil {
			return errResult(err), nil
		}
		if res == nil {
			res = &mcp.CallToolResult{}
		}
		data, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		res.StructuredContent = json.RawMessage(data)
		res.Content = []mcp.Content{&mcp.TextContent{Text: string(data)}}
		return res, nil
	})
}

func errResult(err error) *mcp.CallToolResult {
	var r mcp.CallToolResult
	r.SetError(err)
	return &r
}

// checkArgs checks the arguments against the tool's bounds (the friendly
// messages), then against the whole schema (types, unknown shapes), and
// returns them as JSON ("{}" for none).
func checkArgs(raw json.RawMessage, props map[string]prop, resolved *jsonschema.Resolved) (json.RawMessage, error) {
	args := map[string]any{}
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &args); err != nil {
			return nil, fault.New(fault.Usage, fault.KindUsage, "arguments are not a JSON object: %v", err)
		}
	}
	for name, v := range args {
		if p, ok := props[name]; ok {
			if err := p.check(name, v); err != nil {
				return nil, err
			}
		}
	}
	if err := resolved.Validate(args); err != nil {
		return nil, fault.New(fault.Usage, fault.KindUsage, "arguments: %s", strings.TrimPrefix(err.Error(), "validating root: "))
	}
	return json.Marshal(args)
}

func notNull(s *jsonschema.Schema) *jsonschema.Schema {
	if s == nil {
		return nil
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	for _, p := range s.Properties {
		notNull(p)
	}
	notNull(s.Items)
	return s
}
