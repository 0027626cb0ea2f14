package main

// The scheme of the core server. k8s.io/kubernetes (where the internal types,
// conversions, defaulting and validation of the built-in kinds live) is not
// available, so each served group uses the versioned Go types of k8s.io/api
// as its own internal version too: the same Go type is registered under both
// "v1" and "__internal", which makes every conversion a copy (runtime.Scheme
// short-cuts a conversion when the target kind is already one of the type's
// kinds).

import (
	"fmt"
	"reflect"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
)

var (
	// Scheme holds external and (identical) internal versions of the served kinds.
	Scheme = runtime.NewScheme()
	Codecs = serializer.NewCodecFactory(Scheme)
	// namerScheme has only the external versions: the OpenAPI namer turns every
	// kind registered for a Go type into x-kubernetes-group-version-kind, and an
	// "__internal" entry there would confuse clients and the SSA type converter.
	namerScheme = runtime.NewScheme()

	// one Go type of each served group, to tell its own kinds from meta ones
	groupSample = map[schema.GroupVersion]runtime.Object{
		corev1.SchemeGroupVersion:                  &corev1.Pod{},
		coordinationv1.SchemeGroupVersion:          &coordinationv1.Lease{},
		eventsv1.SchemeGroupVersion:                &eventsv1.Event{},
		admissionregistrationv1.SchemeGroupVersion: &admissionregistrationv1.MutatingWebhookConfiguration{},
		appsv1.SchemeGroupVersion:                  &appsv1.DaemonSet{},
		rbacv1.SchemeGroupVersion:                  &rbacv1.Role{},
	}
	servedGroupVersions = []schema.GroupVersion{
		corev1.SchemeGroupVersion,
		coordinationv1.SchemeGroupVersion,
		eventsv1.SchemeGroupVersion,
		admissionregistrationv1.SchemeGroupVersion,
		appsv1.SchemeGroupVersion,
		rbacv1.SchemeGroupVersion,
	}
)

func init() {
	adders := []func(*runtime.Scheme) error{
		corev1.AddToScheme,
		coordinationv1.AddToScheme,
		eventsv1.AddToScheme,
		admissionregistrationv1.AddToScheme,
		appsv1.AddToScheme,
		rbacv1.AddToScheme,
	}
	for _, add := range adders {
		must(add(Scheme))
		must(add(namerScheme))
	}
	// Options types (ListOptions, DeleteOptions...) for the unversioned "v1",
	// as kube-apiserver's legacyscheme has them.
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})

	for _, gv := range servedGroupVersions {
		registerIdentityInternalVersion(Scheme, gv)
		must(Scheme.SetVersionPriority(gv))
	}
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.MutatingWebhookConfiguration{}, func(obj interface{}) {
		defaultMutatingWebhookConfiguration(obj.(*admissionregistrationv1.MutatingWebhookConfiguration))
	})
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.ValidatingWebhookConfiguration{}, func(obj interface{}) {
		defaultValidatingWebhookConfiguration(obj.(*admissionregistrationv1.ValidatingWebhookConfiguration))
	})
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.MutatingWebhookConfigurationList{}, func(obj interface{}) {
		l := obj.(*admissionregistrationv1.MutatingWebhookConfigurationList)
		for i := range l.Items {
			defaultMutatingWebhookConfiguration(&l.Items[i])
		}
	})
	Scheme.AddTypeDefaultingFunc(&admissionregistrationv1.ValidatingWebhookConfigurationList{}, func(obj interface{}) {
		l := obj.(*admissionregistrationv1.ValidatingWebhookConfigurationList)
		for i := range l.Items {
			defaultValidatingWebhookConfiguration(&l.Items[i])
		}
	})
	for _, k := range kinds {
		registerFieldLabels(Scheme, k)
	}
}

// registerIdentityInternalVersion registers every kind of gv whose Go type
// lives in the k8s.io/api package of that group again under the internal
// version (meta types such as ListOptions keep only their external entries).
func registerIdentityInternalVersion(s *runtime.Scheme, gv schema.GroupVersion) {
	internal := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
	pkg := reflect.TypeOf(groupSample[gv]).Elem().PkgPath()
	for name, t := range s.KnownTypes(gv) {
		if t.PkgPath() != pkg {
			continue
		}
		obj, ok := reflect.New(t).Interface().(runtime.Object)
		if !ok {
			continue
		}
		s.AddKnownTypeWithName(internal.WithKind(name), obj)
	}
}

// registerFieldLabels allows the field selectors a kind supports; without a
// conversion func the scheme accepts only metadata.name/metadata.namespace.
func registerFieldLabels(s *runtime.Scheme, k *kindInfo) {
	allowed := sets.New("metadata.name", "metadata.namespace")
	for label := range k.selectableFields(k.newObj()) {
		allowed.Insert(label)
	}
	must(s.AddFieldLabelConversionFunc(k.gv.WithKind(k.kind), func(label, value string) (string, string, error) {
		if allowed.Has(label) {
			return label, value, nil
		}
		return "", "", fmt.Errorf("field label not supported: %s", label)
	}))
}

// Defaults Kubernetes applies to webhook configurations (from
// pkg/apis/admissionregistration/v1/defaults.go). Without them a webhook
// never matches: a nil namespaceSelector/objectSelector selects nothing.
func defaultRules(rules []admissionregistrationv1.RuleWithOperations) {
	for i := range rules {
		if rules[i].Scope == nil {
			s := admissionregistrationv1.AllScopes
			rules[i].Scope = &s
		}
	}
}

func defaultClientConfig(c *admissionregistrationv1.WebhookClientConfig) {
	if c.Service != nil && c.Service.Port == nil {
		p := int32(443)
		c.Service.Port = &p
	}
}

func defaultCommon(fp **admissionregistrationv1.FailurePolicyType, mp **admissionregistrationv1.MatchPolicyType,
	ns, obj **metav1.LabelSelector, timeout **int32) {
	if *fp == nil {
		v := admissionregistrationv1.Fail
		*fp = &v
	}
	if *mp == nil {
		v := admissionregistrationv1.Equivalent
		*mp = &v
	}
	if *ns == nil {
		*ns = &metav1.LabelSelector{}
	}
	if *obj == nil {
		*obj = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		v := int32(10)
		*timeout = &v
	}
}

func defaultMutatingWebhookConfiguration(c *admissionregistrationv1.MutatingWebhookConfiguration) {
	for i := range c.Webhooks {
		w := &c.Webhooks[i]
		defaultCommon(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds)
		if w.ReinvocationPolicy == nil {
			v := admissionregistrationv1.NeverReinvocationPolicy
			w.ReinvocationPolicy = &v
		}
		defaultRules(w.Rules)
		defaultClientConfig(&w.ClientConfig)
	}
}

func defaultValidatingWebhookConfiguration(c *admissionregistrationv1.ValidatingWebhookConfiguration) {
	for i := range c.Webhooks {
		w := &c.Webhooks[i]
		defaultCommon(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds)
		defaultRules(w.Rules)
		defaultClientConfig(&w.ClientConfig)
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
