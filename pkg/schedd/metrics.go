package schedd

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the ledger and task counts at scrape time.
type collector struct {
	n                                   *node
	capCPU, capMem, resCPU, resMem, tsk *prometheus.Desc
	sent, answered                      *prometheus.Desc
}

func newCollector(n *node) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("shoal_schedd_"+name, help, nil, nil)
	}
	return &collector{
		n:      n,
		capCPU: d("capacity_cpu_millis", "CPU this node offers to tasks."),
		capMem: d("capacity_memory_bytes", "Memory this node offers to tasks."),
		resCPU: d("reserved_cpu_millis", "CPU reserved by tasks on this node (never above capacity)."),
		resMem: d("reserved_memory_bytes", "Memory reserved by tasks on this node (never above capacity)."),
		tsk:    d("tasks", "Tasks this node holds."),
		sent:   d("reserves_sent_total", "Reserve requests this node sent as an owner (to itself included)."),
		answered: prometheus.NewDesc("shoal_schedd_reserves_answered_total",
			"Reserve requests this node answered as a target, by result (accepted, rejected).", []string{"result"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.capCPU, c.capMem, c.resCPU, c.resMem, c.tsk, c.sent, c.answered} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	used, capa := c.n.ledger.Usage(), c.n.ledger.Capacity()
	c.n.amu.Lock()
	tasks := len(c.n.local)
	c.n.amu.Unlock()
	g := prometheus.GaugeValue
	ch <- prometheus.MustNewConstMetric(c.capCPU, g, float64(capa.CPUMillis))
	ch <- prometheus.MustNewConstMetric(c.capMem, g, float64(capa.MemoryBytes))
	ch <- prometheus.MustNewConstMetric(c.resCPU, g, float64(used.CPUMillis))
	ch <- prometheus.MustNewConstMetric(c.resMem, g, float64(used.MemoryBytes))
	ch <- prometheus.MustNewConstMetric(c.tsk, g, float64(tasks))
	ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(c.n.reservesSent.Load()))
	ch <- prometheus.MustNewConstMetric(c.answered, prometheus.CounterValue, float64(c.n.reservesAccepted.Load()), "accepted")
	ch <- prometheus.MustNewConstMetric(c.answered, prometheus.CounterValue, float64(c.n.reservesRejected.Load()), "rejected")
}
