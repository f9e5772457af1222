// Package table is the one table renderer of the commands that print
// tables on a terminal (fleet-roster, fleet-trace). It lives apart from
// pkg/cli: tablewriter and its width tables are initialised at every start
// of a binary that links them, and fleet-send should not pay for them.
package table

import (
	"io"
	"os"

	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/renderer"
	"github.com/olekukonko/tablewriter/tw"
	"golang.org/x/term"
)

// Render writes a borderless table as wide as the terminal. Used only
// when stdout is a terminal; tests assert JSON.
func Render(w io.Writer, header []string, rows [][]string) error {
	width := 120
	if cols, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil && cols > 20 {
		width = cols
	}
	t := tablewriter.NewTable(w,
		tablewriter.WithRenderer(renderer.NewBlueprint(tw.Rendition{
			Borders:  tw.BorderNone,
			Settings: tw.Settings{Lines: tw.LinesNone, Separators: tw.SeparatorsNone},
		})),
		tablewriter.WithMaxWidth(width),
		tablewriter.WithHeaderAutoFormat(tw.Off),
		tablewriter.WithHeaderAlignment(tw.AlignLeft),
		tablewriter.WithRowAlignment(tw.AlignLeft),
		tablewriter.WithRowAutoWrap(tw.WrapNone),
		tablewriter.WithHeaderAutoWrap(tw.WrapNone),
	)
	t.Header(header)
	for _, r := range rows {
		if err := t.Append(r); err != nil {
			return err
		}
	}
	return t.Render()
}
