package main

// The table of served core kinds and what each needs beyond a plain
// genericregistry.Store: scope, a status subresource, and the field selectors
// Kubernetes offers for it (k8s.io/kubernetes defines those per kind).

import (
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type kindInfo struct {
	gv         schema.GroupVersion
	resource   string // plural, as in the URL
	singular   string
	kind       string
	namespaced bool
	hasStatus  bool // serves <resource>/status, and keeps status on main updates
	// allowCreateOnUpdate mirrors Kubernetes (PUT may create leases, events, endpoints)
	allowCreateOnUpdate bool
	shortNames          []string
	categories          []string
	newObj              func() runtime.Object
	newList             func() runtime.Object
	// fields returns the kind's selectable fields besides metadata.*
	fields func(obj runtime.Object) fields.Set
}

// selectableFields is what a field selector may name for this kind.
func (k *kindInfo) selectableFields(obj runtime.Object) fields.Set {
	set := fields.Set{}
	if k.fields != nil {
		set = k.fields(obj)
	}
	return set
}

var kinds = []*kindInfo{
	{gv: corev1.SchemeGroupVersion, resource: "namespaces", kind: "Namespace", hasStatus: true, shortNames: []string{"ns"},
		newObj: func() runtime.Object { return &corev1.Namespace{} }, newList: func() runtime.Object { return &corev1.NamespaceList{} },
		fields: func(o runtime.Object) fields.Set {
			return fields.Set{"status.phase": string(o.(*corev1.Namespace).Status.Phase)}
		}},
	{gv: corev1.SchemeGroupVersion, resource: "nodes", kind: "Node", hasStatus: true, shortNames: []string{"no"},
		newObj: func() runtime.Object { return &corev1.Node{} }, newList: func() runtime.Object { return &corev1.NodeList{} },
		fields: func(o runtime.Object) fields.Set {
			return fields.Set{"spec.unschedulable": boolString(o.(*corev1.Node).Spec.Unschedulable)}
		}},
	{gv: corev1.SchemeGroupVersion, resource: "pods", kind: "Pod", namespaced: true, hasStatus: true,
		shortNames: []string{"po"}, categories: []string{"all"},
		newObj: func() runtime.Object { return &corev1.Pod{} }, newList: func() runtime.Object { return &corev1.PodList{} },
		fields: podFields},
	{gv: corev1.SchemeGroupVersion, resource: "secrets", kind: "Secret", namespaced: true,
		newObj: func() runtime.Object { return &corev1.Secret{} }, newList: func() runtime.Object { return &corev1.SecretList{} },
		fields: func(o runtime.Object) fields.Set { return fields.Set{"type": string(o.(*corev1.Secret).Type)} }},
	{gv: corev1.SchemeGroupVersion, resource: "configmaps", kind: "ConfigMap", namespaced: true, shortNames: []string{"cm"},
		newObj: func() runtime.Object { return &corev1.ConfigMap{} }, newList: func() runtime.Object { return &corev1.ConfigMapList{} }},
	{gv: corev1.SchemeGroupVersion, resource: "events", kind: "Event", namespaced: true, allowCreateOnUpdate: true, shortNames: []string{"ev"},
		newObj: func() runtime.Object { return &corev1.Event{} }, newList: func() runtime.Object { return &corev1.EventList{} },
		fields: coreEventFields},
	{gv: corev1.SchemeGroupVersion, resource: "serviceaccounts", kind: "ServiceAccount", namespaced: true, shortNames: []string{"sa"},
		newObj: func() runtime.Object { return &corev1.ServiceAccount{} }, newList: func() runtime.Object { return &corev1.ServiceAccountList{} }},
	{gv: corev1.SchemeGroupVersion, resource: "services", kind: "Service", namespaced: true, hasStatus: true,
		allowCreateOnUpdate: true, shortNames: []string{"svc"}, categories: []string{"all"},
		newObj: func() runtime.Object { return &corev1.Service{} }, newList: func() runtime.Object { return &corev1.ServiceList{} }},
	{gv: corev1.SchemeGroupVersion, resource: "endpoints", kind: "Endpoints", namespaced: true, allowCreateOnUpdate: true, shortNames: []string{"ep"},
		newObj: func() runtime.Object { return &corev1.Endpoints{} }, newList: func() runtime.Object { return &corev1.EndpointsList{} }},
	{gv: coordinationv1.SchemeGroupVersion, resource: "leases", kind: "Lease", namespaced: true, allowCreateOnUpdate: true,
		newObj: func() runtime.Object { return &coordinationv1.Lease{} }, newList: func() runtime.Object { return &coordinationv1.LeaseList{} }},
	{gv: eventsv1.SchemeGroupVersion, resource: "events", kind: "Event", namespaced: true, allowCreateOnUpdate: true, shortNames: []string{"ev"},
		newObj: func() runtime.Object { return &eventsv1.Event{} }, newList: func() runtime.Object { return &eventsv1.EventList{} },
		fields: eventsV1Fields},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "mutatingwebhookconfigurations", kind: "MutatingWebhookConfiguration",
		categories: []string{"api-extensions"},
		newObj:     func() runtime.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} },
		newList:    func() runtime.Object { return &admissionregistrationv1.MutatingWebhookConfigurationList{} }},
	{gv: admissionregistrationv1.SchemeGroupVersion, resource: "validatingwebhookconfigurations", kind: "ValidatingWebhookConfiguration",
		categories: []string{"api-extensions"},
		newObj:     func() runtime.Object { return &admissionregistrationv1.ValidatingWebhookConfiguration{} },
		newList:    func() runtime.Object { return &admissionregistrationv1.ValidatingWebhookConfigurationList{} }},
	{gv: appsv1.SchemeGroupVersion, resource: "controllerrevisions", kind: "ControllerRevision", namespaced: true,
		newObj: func() runtime.Object { return &appsv1.ControllerRevision{} }, newList: func() runtime.Object { return &appsv1.ControllerRevisionList{} }},
	{gv: appsv1.SchemeGroupVersion, resource: "daemonsets", kind: "DaemonSet", namespaced: true, hasStatus: true,
		shortNames: []string{"ds"}, categories: []string{"all"},
		newObj: func() runtime.Object { return &appsv1.DaemonSet{} }, newList: func() runtime.Object { return &appsv1.DaemonSetList{} }},
	// Stored as written, so `kubectl apply -k deploy/kubernetes` applies whole (no
	// controller-manager runs a Deployment here, and RBAC is not enforced: the audit log
	// is what tests read of who called what).
	{gv: appsv1.SchemeGroupVersion, resource: "deployments", kind: "Deployment", namespaced: true, hasStatus: true,
		shortNames: []string{"deploy"}, categories: []string{"all"},
		newObj: func() runtime.Object { return &appsv1.Deployment{} }, newList: func() runtime.Object { return &appsv1.DeploymentList{} }},
	{gv: rbacv1.SchemeGroupVersion, resource: "roles", kind: "Role", namespaced: true,
		newObj: func() runtime.Object { return &rbacv1.Role{} }, newList: func() runtime.Object { return &rbacv1.RoleList{} }},
	{gv: rbacv1.SchemeGroupVersion, resource: "rolebindings", kind: "RoleBinding", namespaced: true,
		newObj: func() runtime.Object { return &rbacv1.RoleBinding{} }, newList: func() runtime.Object { return &rbacv1.RoleBindingList{} }},
	{gv: rbacv1.SchemeGroupVersion, resource: "clusterroles", kind: "ClusterRole",
		newObj: func() runtime.Object { return &rbacv1.ClusterRole{} }, newList: func() runtime.Object { return &rbacv1.ClusterRoleList{} }},
	{gv: rbacv1.SchemeGroupVersion, resource: "clusterrolebindings", kind: "ClusterRoleBinding",
		newObj: func() runtime.Object { return &rbacv1.ClusterRoleBinding{} }, newList: func() runtime.Object { return &rbacv1.ClusterRoleBindingList{} }},
}

func init() {
	for _, k := range kinds {
		k.singular = strings.ToLower(k.kind)
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// podFields are the selectors of pkg/registry/core/pod/strategy.go.
func podFields(o runtime.Object) fields.Set {
	p := o.(*corev1.Pod)
	podIP := ""
	if len(p.Status.PodIPs) > 0 {
		podIP = p.Status.PodIPs[0].IP
	}
	return fields.Set{
		"spec.nodeName":            p.Spec.NodeName,
		"spec.restartPolicy":       string(p.Spec.RestartPolicy),
		"spec.schedulerName":       p.Spec.SchedulerName,
		"spec.serviceAccountName":  p.Spec.ServiceAccountName,
		"spec.hostNetwork":         boolString(p.Spec.HostNetwork),
		"status.phase":             string(p.Status.Phase),
		"status.podIP":             podIP,
		"status.nominatedNodeName": p.Status.NominatedNodeName,
	}
}

// coreEventFields are the selectors of pkg/registry/core/event/strategy.go.
func coreEventFields(o runtime.Object) fields.Set {
	e := o.(*corev1.Event)
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	return fields.Set{
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"reportingComponent":             e.ReportingController,
		"source":                         source,
		"type":                           e.Type,
	}
}

// eventsV1Fields offers the same selectors under events.k8s.io names.
func eventsV1Fields(o runtime.Object) fields.Set {
	e := o.(*eventsv1.Event)
	return fields.Set{
		"regarding.kind":      e.Regarding.Kind,
		"regarding.namespace": e.Regarding.Namespace,
		"regarding.name":      e.Regarding.Name,
		"regarding.uid":       string(e.Regarding.UID),
		"reason":              e.Reason,
		"reportingController": e.ReportingController,
		"type":                e.Type,
	}
}
