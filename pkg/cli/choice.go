package cli

import (
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// ChoiceFlag is a string flag that takes one of a fixed set of values.
// The parser refuses any other before the command runs (64, with Hint when
// set), and the completions offer exactly Choices (pkg/docs reads them
// here): the list is written once, in the flag's definition.
type ChoiceFlag struct {
	cli.StringFlag
	Choices []string
	Hint    string // the hint line of the refusal; "" for see: NAME --help
}

// Choice is a ChoiceFlag with the default value def ("" for none).
func Choice(name, usage, def string, choices ...string) *ChoiceFlag {
	f := &ChoiceFlag{StringFlag: cli.StringFlag{Name: name, Usage: usage, Value: def}, Choices: choices}
	f.Action = func(c *cli.Context, v string) error {
		if slices.Contains(f.Choices, v) {
			return nil
		}
		err := Usage("--%s takes %s, not %q", f.Name, OrList(f.Choices), v)
		if f.Hint != "" {
			return err.WithHint("%s", f.Hint)
		}
		return err.WithHint("see: %s --help", c.App.Name)
	}
	return f
}

// OrList is "a", "a or b", "a, b or c".
func OrList(words []string) string {
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
