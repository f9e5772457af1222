package docs

import (
	"bytes"
	"embed"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/fleetd/fleet/pkg/config"
	"github.com/russross/blackfriday/v2"
)

// The concept pages (section 7) and the config file's page (section 5)
// are written as markdown in pages/NAME.SECTION.md and rendered to
// man/NAME.SECTION by go-md2man, the renderer urfave/cli uses for the
// section-1 pages, with two changes of fleet's own: a table becomes an
// aligned block when it fits a terminal and a tagged list (.TP) when it
// does not (tbl squeezes wide tables into one word a line), and a page
// may hold a generated part, a line
//
//	<!-- fleet:config-keys -->   every setting of pkg/config, as a table
//	<!-- fleet:exit-codes -->    the exit codes of pkg/fault, as a table
//
// so that what the definitions already say is written once. Sections are
// "##" headings (.SH) and "###" ones (.SS); a page has no "#" heading,
// since its .TH line comes from its file name.
//
//go:embed pages/*.md
var pageFS embed.FS

// page is one markdown source under pages/.
type page struct {
	Name, Section string
	Src           []byte
}

func readPages() ([]page, error) {
	names, err := pageFS.ReadDir("pages")
	if err != nil {
		return nil, err
	}
	var ps []page
	for _, e := range names {
		base, ok := strings.CutSuffix(e.Name(), ".md")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(base, '.')
		if i < 0 || (base[i+1:] != "5" && base[i+1:] != "7") {
			return nil, fmt.Errorf("pages/%s: want NAME.5.md or NAME.7.md", e.Name())
		}
		src, err := pageFS.ReadFile(path.Join("pages", e.Name()))
		if err != nil {
			return nil, err
		}
		ps = append(ps, page{Name: base[:i], Section: base[i+1:], Src: src})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
	return ps, nil
}

// generated is what each marker line of a page is replaced by.
func generated() map[string]string {
	var keys strings.Builder
	keys.WriteString("| key | what |\n|---|---|\n")
	for _, k := range config.Keys {
		fmt.Fprintf(&keys, "| `%s` | %s. Variable `%s`, default: %s. |\n", k.Name, mdCell(k.Usage), k.Env, mdCell(k.Default))
	}
	var codes strings.Builder
	codes.WriteString("| code | meaning |\n|---|---|\n")
	for _, e := range exitCodes {
		fmt.Fprintf(&codes, "| %d | %s |\n", e.Code, mdCell(codeText(e)))
	}
	return map[string]string{
		"<!-- fleet:config-keys -->": keys.String(),
		"<!-- fleet:exit-codes -->":  codes.String(),
	}
}

// mdCell keeps a generated text from being read as markdown.
func mdCell(s string) string {
	r := strings.NewReplacer("|", `\|`, "*", `\*`, "_", `\_`, "`", "\\`", "<", `\<`)
	return r.Replace(s)
}

// expand replaces the marker lines of a page by what they stand for.
func expand(src []byte) []byte {
	gen := generated()
	lines := strings.SplitAfter(string(src), "\n")
	for i, l := range lines {
		if g, ok := gen[strings.TrimSpace(l)]; ok {
			lines[i] = g
		}
	}
	return []byte(strings.Join(lines, ""))
}

// renderPage turns one page into roff.
func renderPage(p page) ([]byte, error) {
	r := &pageRenderer{inner: md2man.NewRoffRenderer()}
	body := blackfriday.Run(expand(p.Src),
		blackfriday.WithRenderer(r),
		blackfriday.WithExtensions(r.inner.GetExtensions()))
	if r.err != nil {
		return nil, fmt.Errorf("pages/%s.%s.md: %w", p.Name, p.Section, r.err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, ".nh\n.TH %s %s\n", p.Name, p.Section)
	b.Write(bytes.TrimLeft(body, "\n"))
	return b.Bytes(), nil
}

// pageRenderer is go-md2man's roff renderer with fleet's tables.
type pageRenderer struct {
	inner interface {
		blackfriday.Renderer
		GetExtensions() blackfriday.Extensions
	}
	err error
}

// RenderHeader writes nothing: renderPage writes .nh and .TH itself, and
// no page needs tbl.
func (r *pageRenderer) RenderHeader(io.Writer, *blackfriday.Node) {}

func (r *pageRenderer) RenderFooter(w io.Writer, ast *blackfriday.Node) {
	r.inner.RenderFooter(w, ast)
}

func (r *pageRenderer) RenderNode(w io.Writer, node *blackfriday.Node, entering bool) blackfriday.WalkStatus {
	switch node.Type {
	case blackfriday.Table:
		if entering {
			r.table(w, node)
		}
		return blackfriday.SkipChildren
	case blackfriday.Heading:
		if entering && node.Level == 1 && r.err == nil {
			r.err = fmt.Errorf("a '#' heading (%q): sections are '##', subsections '###'", plain(node))
		}
	case blackfriday.HTMLBlock:
		if entering && !bytes.HasPrefix(node.Literal, []byte("<!--")) && r.err == nil {
			r.err = fmt.Errorf("HTML is not rendered: %q", node.Literal)
		}
	}
	return r.inner.RenderNode(w, node, entering)
}

// maxTableWidth is the widest table kept as an aligned block: what an
// 80-column terminal shows after man's indents.
const maxTableWidth = 66

// table writes a table as an aligned block of its plain text when it fits
// maxTableWidth, else as a tagged list: each row's first cell is the tag,
// the other cells its text (each after its column's header when there
// are more than two columns).
func (r *pageRenderer) table(w io.Writer, tbl *blackfriday.Node) {
	var rows [][]*blackfriday.Node
	tbl.Walk(func(n *blackfriday.Node, entering bool) blackfriday.WalkStatus {
		if entering && n.Type == blackfriday.TableRow {
			var cells []*blackfriday.Node
			for c := n.FirstChild; c != nil; c = c.Next {
				cells = append(cells, c)
			}
			rows = append(rows, cells)
			return blackfriday.SkipChildren
		}
		return blackfriday.GoToNext
	})
	if len(rows) == 0 {
		return
	}
	ncol := len(rows[0])
	widths := make([]int, ncol)
	for _, row := range rows {
		for j, c := range row {
			if j < ncol {
				widths[j] = max(widths[j], textWidth(plain(c)))
			}
		}
	}
	total := 2 * (ncol - 1)
	for _, wd := range widths {
		total += wd
	}
	if total <= maxTableWidth {
		io.WriteString(w, "\n.PP\n.RS 4\n.EX\n")
		for i, row := range rows {
			var line strings.Builder
			for j, c := range row {
				if j >= ncol {
					break
				}
				t := plain(c)
				line.WriteString(t)
				if j < ncol-1 {
					line.WriteString(strings.Repeat(" ", widths[j]-textWidth(t)+2))
				}
			}
			io.WriteString(w, roffText(strings.TrimRight(line.String(), " "))+"\n")
			if i == 0 {
				var rule []string
				for _, wd := range widths {
					rule = append(rule, strings.Repeat("-", wd))
				}
				io.WriteString(w, strings.Join(rule, "  ")+"\n")
			}
		}
		io.WriteString(w, ".EE\n.RE\n")
		return
	}
	header := rows[0]
	for _, row := range rows[1:] {
		io.WriteString(w, "\n.TP\n")
		io.WriteString(w, r.inline(row[0])+"\n")
		var parts []string
		for j := 1; j < len(row) && j < ncol; j++ {
			text := r.inline(row[j])
			if strings.TrimSpace(plain(row[j])) == "" {
				continue
			}
			if ncol > 2 && strings.TrimSpace(plain(header[j])) != "" {
				text = "\\fI" + roffText(plain(header[j])) + "\\fR: " + text
			}
			parts = append(parts, text)
		}
		io.WriteString(w, strings.Join(parts, "\n.br\n")+"\n")
	}
}

// inline renders a cell's content as one line of roff.
func (r *pageRenderer) inline(cell *blackfriday.Node) string {
	var b bytes.Buffer
	cell.Walk(func(n *blackfriday.Node, entering bool) blackfriday.WalkStatus {
		if n == cell {
			return blackfriday.GoToNext
		}
		return r.inner.RenderNode(&b, n, entering)
	})
	s := strings.ReplaceAll(b.String(), "\n", " ")
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// plain is a node's text without its markup.
func plain(n *blackfriday.Node) string {
	var b strings.Builder
	n.Walk(func(c *blackfriday.Node, entering bool) blackfriday.WalkStatus {
		if entering && (c.Type == blackfriday.Text || c.Type == blackfriday.Code) {
			b.Write(c.Literal)
		}
		return blackfriday.GoToNext
	})
	return b.String()
}

// textWidth counts runes: the tables hold no wide characters.
func textWidth(s string) int { return len([]rune(s)) }
