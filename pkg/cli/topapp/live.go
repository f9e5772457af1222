package topapp

import (
	ucli "github.com/urfave/cli/v2"
)

func live(c *ucli.Context, src *source) error { return nil }
