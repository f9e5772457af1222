package hooks

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Codex keeps its MCP servers in config.toml, a file the user writes by
// hand (comments, order, layout). No Go TOML library edits a file keeping
// its layout, so the installer edits the text: go-toml's parser says where
// each table begins, fleet's own tables ([mcp_servers.fleet] and the ones
// below it) are cut out or put in whole, and every byte outside them stays
// as it was. The result is parsed back before it is written: everything
// but fleet's entry must decode as it did, and fleet's entry as meant.

// codexTable is fleet's entry as config.toml text.
func codexTable(o MCPOptions) string {
	var b strings.Builder
	b.WriteString("[mcp_servers.fleet]\n")
	b.WriteString("command = \"fleet-mcp\"\n")
	entity, _ := tomlString(o.Entity) // an entity name: letters, digits, - and _
	fmt.Fprintf(&b, "args = [\"--as\", %s]\n", entity)
	vars := make([]string, len(codexEnvVars))
	for i, v := range codexEnvVars {
		vars[i] = `"` + v + `"`
	}
	fmt.Fprintf(&b, "env_vars = [%s]\n", strings.Join(vars, ", "))
	fmt.Fprintf(&b, "tool_timeout_sec = %d\n", MCPToolTimeout)
	mode := "writes"
	if slices.Contains(o.Approve, "all") {
		mode = "approve"
	}
	fmt.Fprintf(&b, "default_tools_approval_mode = %q\n", mode)
	if mode != "approve" {
		tools := slices.Clone(o.Approve)
		slices.Sort(tools)
		for _, t := range slices.Compact(tools) {
			fmt.Fprintf(&b, "\n[mcp_servers.fleet.tools.%s]\napproval_mode = \"approve\"\n", t)
		}
	}
	return b.String()
}

// codexDecode decodes config.toml text.
func codexDecode(path string, b []byte) (map[string]any, error) {
	doc := map[string]any{}
	if err := toml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s is not valid TOML: %v", path, err)
	}
	return doc, nil
}

// fleetOf is doc's mcp_servers.fleet, or nil.
func fleetOf(doc map[string]any) map[string]any {
	servers, _ := doc["mcp_servers"].(map[string]any)
	m, _ := servers[MCPServer].(map[string]any)
	return m
}

// withoutFleet is doc without mcp_servers.fleet (and without mcp_servers
// if that was all it held), for comparing the rest of two files.
func withoutFleet(doc map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range doc {
		out[k] = v
	}
	if servers, ok := doc["mcp_servers"].(map[string]any); ok {
		rest := map[string]any{}
		for k, v := range servers {
			if k != MCPServer {
				rest[k] = v
			}
		}
		if len(rest) == 0 {
			delete(out, "mcp_servers")
		} else {
			out["mcp_servers"] = rest
		}
	}
	return out
}

func codexRead(path string) ([]byte, map[string]any, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, map[string]any{}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	doc, err := codexDecode(path, b)
	return b, doc, err
}

// codexFleetEntry is config.toml's mcp_servers.fleet, or nil.
func codexFleetEntry(path string) (map[string]any, error) {
	_, doc, err := codexRead(path)
	if err != nil {
		return nil, err
	}
	return fleetOf(doc), nil
}

// codexWant is fleet's entry as it decodes.
func codexWant(o MCPOptions) map[string]any {
	doc, err := codexDecode("fleet's entry", []byte(codexTable(o)))
	if err != nil {
		panic(err) // fleet's own text
	}
	return fleetOf(doc)
}

// codexMatches says whether have is fleet's entry for entity, with any of
// the approval settings the installer writes.
func codexMatches(have map[string]any, entity string) bool {
	strip := func(m map[string]any) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			if k != "default_tools_approval_mode" && k != "tools" {
				out[k] = v
			}
		}
		return out
	}
	if !reflect.DeepEqual(strip(have), strip(codexWant(MCPOptions{Entity: entity}))) {
		return false
	}
	switch have["default_tools_approval_mode"] {
	case "writes", "approve":
	default:
		return false
	}
	tools, ok := have["tools"].(map[string]any)
	if _, present := have["tools"]; present && !ok {
		return false
	}
	for name, v := range tools {
		if !slices.Contains(MCPTools, name) || !reflect.DeepEqual(v, map[string]any{"approval_mode": "approve"}) {
			return false
		}
	}
	return true
}

// codexRegions are the byte ranges of fleet's tables in config.toml text:
// each from its header's line to the next table that is not fleet's, less
// the blank and comment lines before that one (they belong to it).
func codexRegions(path string, b []byte) ([][2]int, error) {
	type expr struct {
		start int
		table bool
		fleet bool
	}
	var exprs []expr
	var p unstable.Parser
	p.Reset(b)
	var cur []string
	isFleet := func(key []string) bool {
		return len(key) >= 2 && key[0] == "mcp_servers" && key[1] == MCPServer
	}
	for p.NextExpression() {
		e := p.Expression()
		var key []string
		first := -1
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable, unstable.KeyValue:
			it := e.Key()
			for it.Next() {
				n := it.Node()
				if first < 0 {
					first = int(n.Raw.Offset)
				}
				key = append(key, string(n.Data))
			}
		default:
			continue
		}
		start := bytes.LastIndexByte(b[:first], '\n') + 1
		if e.Kind == unstable.KeyValue {
			full := append(slices.Clone(cur), key...)
			if isFleet(full) && !isFleet(cur) {
				return nil, &UneditableError{File: path, Why: "mcp_servers.fleet is written as dotted keys or an inline table; fleet edits only a [mcp_servers.fleet] table: rewrite it as one, or take it out"}
			}
			continue
		}
		cur = key
		exprs = append(exprs, expr{start: start, table: true, fleet: isFleet(key)})
	}
	if err := p.Error(); err != nil {
		return nil, fmt.Errorf("%s is not valid TOML: %v", path, err)
	}
	var out [][2]int
	for i := 0; i < len(exprs); i++ {
		if !exprs[i].fleet {
			continue
		}
		start := exprs[i].start
		for i+1 < len(exprs) && exprs[i+1].fleet {
			i++
		}
		end := len(b)
		if i+1 < len(exprs) {
			end = exprs[i+1].start
		}
		headerEnd := bytes.IndexByte(b[start:], '\n')
		if headerEnd < 0 {
			headerEnd = len(b)
		} else {
			headerEnd += start + 1
		}
		for end > headerEnd {
			ls := bytes.LastIndexByte(b[:end-1], '\n') + 1
			line := strings.TrimSpace(string(b[ls:end]))
			if line != "" && line[0] != '#' {
				break
			}
			end = ls
		}
		out = append(out, [2]int{start, end})
	}
	return out, nil
}

// cut is b without the regions, the first replaced by put; a blank line
// left doubled (or trailing) where a region was is taken out once.
func cut(b []byte, regions [][2]int, put string) []byte {
	var out []byte
	last := 0
	for i, r := range regions {
		out = append(out, b[last:r[0]]...)
		if i == 0 && put != "" {
			out = append(out, put...)
		} else {
			rest := b[r[1]:]
			blankBefore := bytes.HasSuffix(out, []byte("\n\n")) || len(out) == 0
			if blankBefore && (len(rest) == 0 || rest[0] == '\n') && len(out) > 0 {
				out = out[:len(out)-1]
			}
		}
		last = r[1]
	}
	return append(out, b[last:]...)
}

// codexWrite checks that out decodes as doc with fleet's entry set to want
// (nil: none), then writes it.
func codexWrite(path string, doc map[string]any, out []byte, want map[string]any) error {
	got, err := codexDecode(path, out)
	if err == nil && (!reflect.DeepEqual(withoutFleet(got), withoutFleet(doc)) || !reflect.DeepEqual(fleetOf(got), want)) {
		err = fmt.Errorf("the edit would change more than fleet's entry")
	}
	if err != nil {
		return &UneditableError{File: path, Why: "cannot edit it safely (" + err.Error() + "); add fleet's entry by hand: fleet-mcp(1)"}
	}
	return writeKeeping(path, out)
}

func codexInstallMCP(path string, o MCPOptions) (bool, error) {
	b, doc, err := codexRead(path)
	if err != nil {
		return false, err
	}
	want := codexWant(o)
	have := fleetOf(doc)
	if have != nil {
		if reflect.DeepEqual(have, want) {
			return false, nil
		}
		if !o.Force && !codexMatches(have, o.Entity) {
			return false, &DiffersError{File: path, Have: canonical(have)}
		}
	}
	regions, err := codexRegions(path, b)
	if err != nil {
		return false, err
	}
	var out []byte
	if len(regions) > 0 {
		out = cut(b, regions, codexTable(o))
	} else {
		out = slices.Clone(b)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		if len(out) > 0 {
			out = append(out, '\n')
		}
		out = append(out, codexTable(o)...)
	}
	return true, codexWrite(path, doc, out, want)
}

func codexRemoveMCP(path string) (bool, error) {
	b, doc, err := codexRead(path)
	if err != nil {
		return false, err
	}
	have := fleetOf(doc)
	if have == nil || !isFleetMCP(have["command"]) {
		return false, nil
	}
	regions, err := codexRegions(path, b)
	if err != nil {
		return false, err
	}
	out := cut(b, regions, "")
	return true, codexWrite(path, doc, out, nil)
}
