package ctl

import (
	"context"
	"strings"
	"testing"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// TestRenderTemplate: a template prints each item of a list a line, or
// the one value; json, join, upper and lower are there.
func TestRenderTemplate(t *testing.T) {
	type item struct {
		Name  string
		Nodes []string
	}
	items := []item{{"web", []string{"n1", "n2"}}, {"db", nil}}
	var b strings.Builder
	if err := render(&b, "template={{upper .Name}}:{{join .Nodes \",\"}}", items, nil); err != nil {
		t.Fatal(err)
	}
	if b.String() != "WEB:n1,n2\nDB:\n" {
		t.Errorf("list: %q", b.String())
	}
	b.Reset()
	if err := render(&b, "template={{json .}}", item{Name: "one"}, nil); err != nil || b.String() != "{\"Name\":\"one\",\"Nodes\":null}\n" {
		t.Errorf("one value: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := render(&b, "template={{.Colour}}", items, nil); err == nil || !strings.Contains(err.Error(), "Colour") {
		t.Errorf("a field there is not: %v", err)
	}
	for _, bad := range []string{"template={{.Name", "xml", ""} {
		if err := checkFormat(bad); err == nil {
			t.Errorf("checkFormat(%q) accepted", bad)
		}
	}
}

// TestFormatFlag: docker's --format is a template, or json.
func TestFormatFlag(t *testing.T) {
	dir, _ := startFakeSchedd(t)
	out, errOut, code := ctlRun(t, "--run-dir", dir, "service", "stats", "web", "--no-stream", "--format", "{{.Task}} {{.Slot}} {{.MemoryBytes}}")
	if code != 0 || out != "aaa1 1 16777216\nbbb2 2 0\n" {
		t.Errorf("--format: exit %d, %q, %s", code, out, errOut)
	}
	out, _, code = ctlRun(t, "--run-dir", dir, "task", "stats", "aaa1", "--no-stream", "--format", "json")
	if code != 0 || !strings.HasPrefix(out, "[{\"task\":\"aaa1\"") {
		t.Errorf("--format json: exit %d, %q", code, out)
	}
	if _, errOut, code := ctlRun(t, "--run-dir", dir, "task", "ls", "--format", "{{.ID"); code != 2 || !strings.Contains(errOut, "template") {
		t.Errorf("a template that does not parse: exit %d, %q", code, errOut)
	}
}

// TestQuietFlag: -q prints each task's ID alone.
func TestQuietFlag(t *testing.T) {
	dir, _ := startFakeSchedd(t)
	out, errOut, code := ctlRun(t, "--run-dir", dir, "task", "ls", "-q")
	if code != 0 || out != "web.1.x\n" {
		t.Errorf("task ls -q: exit %d, %q, %s", code, out, errOut)
	}
}

func (f *fakeSchedd) ListTasks(_ context.Context, req *schedv1.ListTasksRequest) (*schedv1.ListTasksResponse, error) {
	return &schedv1.ListTasksResponse{Tasks: []*schedv1.Task{{Id: "web.1.x", Service: "web", Slot: "1", State: "running", Current: true}}}, nil
}
