// Package version holds the build's version, set by the Makefile from
// `git describe` through -ldflags "-X github.com/fleetd/fleet/pkg/version.Version=...".
package version

// Version of this build.
var Version = "dev"
