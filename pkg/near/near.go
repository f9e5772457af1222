// Package near finds the word nearest a mistyped one: "did you mean" for
// flags, commands (pkg/cli) and entity names and groups (pkg/gateway).
package near

import "strings"

// Closest returns the candidate nearest to word, or "" when none is near:
// edit distance at most 2 (1 for words of up to 4 letters), or the only
// candidate word is a prefix of.
func Closest(word string, candidates []string) string {
	if len([]rune(word)) < 2 {
		return "" // one letter is near everything
	}
	best, bestD := "", 3
	if len(word) <= 4 {
		bestD = 2
	}
	var prefixed []string
	tied := false
	seen := map[string]bool{}
	for _, c := range candidates {
		if c == word {
			return c
		}
		if seen[c] {
			continue // one candidate named twice (an option of two levels) is no tie
		}
		seen[c] = true
		if strings.HasPrefix(c, word) && len(word) >= 2 {
			prefixed = append(prefixed, c)
		}
		if d := distance(word, c); d < bestD {
			best, bestD, tied = c, d, false
		} else if d == bestD && best != "" {
			tied = true // two as near: naming one would be a guess
		}
	}
	if best == "" && len(prefixed) == 1 {
		return prefixed[0]
	}
	if tied {
		return ""
	}
	return best
}

// distance is the edit distance of a and b, a swap of neighbours counting
// as one edit (optimal string alignment): "josn" is one edit from "json".
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
