// Package promtest reads metrics from a Prometheus registry in tests.
package promtest

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum is the sum of the series of metric name on g whose labels include
// each "name=value" given (a histogram's series count its observations),
// and how many series matched.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (sum float64, series int) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if slices.ContainsFunc(labels, func(want string) bool { return !hasLabel(m, want) }) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			series++
		}
	}
	return sum, series
}

// Value is Sum's sum; it fails the test when no series matches.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum, series := Sum(t, g, name, labels...)
	if series == 0 {
		t.Fatalf("no series of %s with %v", name, labels)
	}
	return sum
}

func hasLabel(m *dto.Metric, want string) bool {
	return slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName()+"="+l.GetValue() == want })
}
