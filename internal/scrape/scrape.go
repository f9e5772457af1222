// Package scrape reads a Prometheus endpoint the way Prometheus does, for
// the tests: one GET asking for the text format, parsed by Prometheus's
// own text parser (github.com/prometheus/common/expfmt), so a test fails
// on anything a real scraper would reject. Only tests import it.
package scrape

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Get scrapes url (http://HOST:PORT/metrics) and parses it.
func Get(url string) (Families, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// what Prometheus sends when it wants the classic text format
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1")
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("GET %s: content type %q, want the text format", url, ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: not the Prometheus text format: %w", url, err)
	}
	return fams, nil
}

// Value is the value of the one sample of family name whose labels
// include labels (name=value pairs): a counter's or gauge's value, a
// histogram's sample count. ok is false when no sample matches; more than
// one match is an error (the test asked vaguely).
func (f Families) Value(name string, labels ...string) (v float64, ok bool, err error) {
	fam := f[name]
	if fam == nil {
		return 0, false, nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	found := 0
	for _, m := range fam.Metric {
		if !matches(m, want) {
			continue
		}
		found++
		switch {
		case m.Counter != nil:
			v = m.Counter.GetValue()
		case m.Gauge != nil:
			v = m.Gauge.GetValue()
		case m.Histogram != nil:
			v = float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			v = m.Untyped.GetValue()
		default:
			return 0, false, fmt.Errorf("%s: a sample of a type this helper does not read", name)
		}
	}
	if found > 1 {
		return 0, false, fmt.Errorf("%s%v: %d samples match", name, want, found)
	}
	return v, found == 1, nil
}

// Count is how many samples family name has.
func (f Families) Count(name string) int {
	if fam := f[name]; fam != nil {
		return len(fam.Metric)
	}
	return 0
}

// Lines renders every sample as `name{label="value",...} value`, labels
// sorted, one per line and sorted (histograms as _count and _sum): what a
// script matches with stdout.
func (f Families) Lines() []string {
	var out []string
	for name, fam := range f {
		for _, m := range fam.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			sel := ""
			if len(ls) > 0 {
				sel = "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out = append(out, fmt.Sprintf("%s%s %v", name, sel, m.Counter.GetValue()))
			case m.Gauge != nil:
				out = append(out, fmt.Sprintf("%s%s %v", name, sel, m.Gauge.GetValue()))
			case m.Untyped != nil:
				out = append(out, fmt.Sprintf("%s%s %v", name, sel, m.Untyped.GetValue()))
			case m.Histogram != nil:
				out = append(out, fmt.Sprintf("%s_count%s %d", name, sel, m.Histogram.GetSampleCount()),
					fmt.Sprintf("%s_sum%s %v", name, sel, m.Histogram.GetSampleSum()))
			case m.Summary != nil:
				out = append(out, fmt.Sprintf("%s_count%s %d", name, sel, m.Summary.GetSampleCount()))
			}
		}
	}
	sort.Strings(out)
	return out
}

func matches(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.Label {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}
