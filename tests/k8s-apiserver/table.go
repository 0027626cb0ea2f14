package main

// Table output for `kubectl get`. The printers of k8s.io/kubernetes are not
// available; the default (name, creation time) is kept for most kinds, and the
// few columns tests look at are added for pods, nodes and leases.

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apiserver/pkg/registry/rest"
)

type column struct {
	name string
	cell func(obj runtime.Object) interface{}
	wide bool // shown only with -o wide
	typ  string
}

var extraColumns = map[string][]column{
	"Pod": {
		{name: "Status", typ: "string", cell: func(o runtime.Object) interface{} {
			p := o.(*corev1.Pod)
			if p.DeletionTimestamp != nil {
				return "Terminating"
			}
			return string(p.Status.Phase)
		}},
		{name: "Node", typ: "string", cell: func(o runtime.Object) interface{} { return none(o.(*corev1.Pod).Spec.NodeName) }},
		{name: "IP", typ: "string", wide: true, cell: func(o runtime.Object) interface{} { return none(o.(*corev1.Pod).Status.PodIP) }},
	},
	"Node": {
		{name: "Status", typ: "string", cell: func(o runtime.Object) interface{} {
			n := o.(*corev1.Node)
			status := "Unknown"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					status = map[corev1.ConditionStatus]string{corev1.ConditionTrue: "Ready", corev1.ConditionFalse: "NotReady"}[c.Status]
				}
			}
			if n.Spec.Unschedulable {
				status += ",SchedulingDisabled"
			}
			return status
		}},
	},
	"Lease": {
		{name: "Holder", typ: "string", cell: func(o runtime.Object) interface{} {
			if h := o.(*coordinationv1.Lease).Spec.HolderIdentity; h != nil {
				return *h
			}
			return ""
		}},
	},
}

func none(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

type tableConv struct {
	cols []column
}

func tableConvertor(k *kindInfo, gr schema.GroupResource) rest.TableConvertor {
	cols, ok := extraColumns[k.kind]
	if !ok || k.gv.Group != "" && k.gv.Group != coordinationv1.GroupName {
		return rest.NewDefaultTableConvertor(gr)
	}
	return tableConv{cols: cols}
}

func (t tableConv) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{}
	table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{
		Name: "Name", Type: "string", Format: "name", Description: "Name of the object"})
	for _, c := range t.cols {
		priority := int32(0)
		if c.wide {
			priority = 1
		}
		table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{Name: c.name, Type: c.typ, Priority: priority})
	}
	table.ColumnDefinitions = append(table.ColumnDefinitions, metav1.TableColumnDefinition{Name: "Age", Type: "string"})
	addRow := func(obj runtime.Object) error {
		m, err := meta.Accessor(obj)
		if err != nil {
			return err
		}
		cells := []interface{}{m.GetName()}
		for _, c := range t.cols {
			cells = append(cells, c.cell(obj))
		}
		age := "<unknown>"
		if ts := m.GetCreationTimestamp(); !ts.IsZero() {
			age = duration.HumanDuration(time.Since(ts.Time))
		}
		cells = append(cells, age)
		table.Rows = append(table.Rows, metav1.TableRow{Cells: cells, Object: runtime.RawExtension{Object: obj}})
		return nil
	}
	if meta.IsListType(object) {
		if err := meta.EachListItem(object, addRow); err != nil {
			return nil, err
		}
		if l, err := meta.ListAccessor(object); err == nil {
			table.ResourceVersion = l.GetResourceVersion()
			table.Continue = l.GetContinue()
			table.RemainingItemCount = l.GetRemainingItemCount()
		}
	} else {
		if err := addRow(object); err != nil {
			return nil, err
		}
		if m, err := meta.Accessor(object); err == nil {
			table.ResourceVersion = m.GetResourceVersion()
		}
	}
	return table, nil
}
