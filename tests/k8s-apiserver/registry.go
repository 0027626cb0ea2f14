package main

// One genericregistry.Store per kind, with a generic strategy in place of the
// per-kind strategies of k8s.io/kubernetes: what it keeps from them is the
// spec/status split (status subresources only change status, main updates
// never change it), generation bumps on spec changes, a few create-time
// defaults, and the checks that make a webhook configuration usable.

import (
	"context"
	"fmt"
	"reflect"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	k *kindInfo
}

func (s strategy) NamespaceScoped() bool           { return s.k.namespaced }
func (s strategy) AllowCreateOnUpdate() bool       { return s.k.allowCreateOnUpdate }
func (s strategy) AllowUnconditionalUpdate() bool  { return true }
func (s strategy) Canonicalize(obj runtime.Object) {}
func (s strategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string {
	return nil
}
func (s strategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string {
	return nil
}

// GetResetFields tells server-side apply that main-resource writes do not own status.
func (s strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if !s.k.hasStatus {
		return nil
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.k.gv.String()): fieldpath.NewSet(fieldpath.MakePathOrDie("status")),
	}
}

func (s strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if m, err := meta.Accessor(obj); err == nil && hasField(obj, "Spec") {
		m.SetGeneration(1)
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		foldStringData(o)
	case *corev1.Pod:
		// as Kubernetes: a new pod's status is written by its kubelet, never by its creator
		o.Status = corev1.PodStatus{Phase: corev1.PodPending}
	case *corev1.Namespace:
		o.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
		if o.Labels == nil {
			o.Labels = map[string]string{}
		}
		// set by Kubernetes on every namespace; namespaceSelectors rely on it
		o.Labels[corev1.LabelMetadataName] = o.Name
	}
}

func (s strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if s.k.hasStatus {
		copyField(obj, old, "Status")
	}
	if hasField(obj, "Spec") && !equality.Semantic.DeepEqual(field0(obj, "Spec"), field0(old, "Spec")) {
		m, _ := meta.Accessor(obj)
		om, _ := meta.Accessor(old)
		m.SetGeneration(om.GetGeneration() + 1)
	}
	if secret, ok := obj.(*corev1.Secret); ok {
		foldStringData(secret)
	}
	if ns, ok := obj.(*corev1.Namespace); ok {
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels[corev1.LabelMetadataName] = ns.Name
	}
}

// foldStringData does what Kubernetes' Secret conversion does: stringData is write-only,
// merged into data (over keys data already has) and never stored.
func foldStringData(secret *corev1.Secret) {
	if len(secret.StringData) == 0 {
		return
	}
	if secret.Data == nil {
		secret.Data = map[string][]byte{}
	}
	for key, value := range secret.StringData {
		secret.Data[key] = []byte(value)
	}
	secret.StringData = nil
}

func (s strategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	return validateWebhooks(obj)
}

func (s strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	return validateWebhooks(obj)
}

// statusStrategy serves <resource>/status: only status changes are kept.
type statusStrategy struct{ strategy }

func (s statusStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.k.gv.String()): fieldpath.NewSet(fieldpath.MakePathOrDie("spec")),
	}
}

func (s statusStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if hasField(obj, "Spec") {
		copyField(obj, old, "Spec")
	}
}

func (s statusStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	return nil
}

func hasField(obj runtime.Object, name string) bool {
	return reflect.ValueOf(obj).Elem().FieldByName(name).IsValid()
}

func field0(obj runtime.Object, name string) interface{} {
	return reflect.ValueOf(obj).Elem().FieldByName(name).Interface()
}

// copyField sets obj.<name> = old.<name> on two objects of the same kind.
func copyField(obj, old runtime.Object, name string) {
	dst := reflect.ValueOf(obj).Elem().FieldByName(name)
	src := reflect.ValueOf(old).Elem().FieldByName(name)
	if dst.IsValid() && src.IsValid() {
		dst.Set(src)
	}
}

// validateWebhooks rejects what kube-apiserver rejects and what would make a
// webhook misbehave silently: v1 has no default for sideEffects or
// admissionReviewVersions, and a clientConfig needs exactly one of url/service.
func validateWebhooks(obj runtime.Object) field.ErrorList {
	type hook struct {
		name     string
		side     *admissionregistrationv1.SideEffectClass
		versions []string
		cc       admissionregistrationv1.WebhookClientConfig
	}
	var hooks []hook
	switch o := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for _, w := range o.Webhooks {
			hooks = append(hooks, hook{w.Name, w.SideEffects, w.AdmissionReviewVersions, w.ClientConfig})
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for _, w := range o.Webhooks {
			hooks = append(hooks, hook{w.Name, w.SideEffects, w.AdmissionReviewVersions, w.ClientConfig})
		}
	default:
		return nil
	}
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, h := range hooks {
		p := field.NewPath("webhooks").Index(i)
		if h.name == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		} else if seen[h.name] {
			errs = append(errs, field.Duplicate(p.Child("name"), h.name))
		}
		seen[h.name] = true
		if h.side == nil {
			errs = append(errs, field.Required(p.Child("sideEffects"), "must specify one of None, NoneOnDryRun"))
		}
		if len(h.versions) == 0 {
			errs = append(errs, field.Required(p.Child("admissionReviewVersions"),
				"must specify one of v1, v1beta1"))
		}
		if (h.cc.URL == nil) == (h.cc.Service == nil) {
			errs = append(errs, field.Required(p.Child("clientConfig"), "exactly one of url or service is required"))
		}
	}
	return errs
}

// getAttrs feeds label and field selectors (for lists and watches).
func (k *kindInfo) getAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	f := k.selectableFields(obj)
	f["metadata.name"] = m.GetName()
	if k.namespaced {
		f["metadata.namespace"] = m.GetNamespace()
	}
	return labels.Set(m.GetLabels()), f, nil
}

// REST is a Store that also advertises short names and categories in discovery.
type REST struct {
	*genericregistry.Store
	k *kindInfo
}

func (r *REST) ShortNames() []string { return r.k.shortNames }
func (r *REST) Categories() []string { return r.k.categories }

// statusREST exposes only get/update/patch of the status subresource.
type statusREST struct{ store *genericregistry.Store }

func (r *statusREST) New() runtime.Object { return r.store.New() }
func (r *statusREST) Destroy()            {}
func (r *statusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}
func (r *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo,
	createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc,
	forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	// subresources never create
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}
func (r *statusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}
func (r *statusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}

// newStorage builds the REST storage of one kind, plus its status subresource.
func newStorage(k *kindInfo, optsGetter generic.RESTOptionsGetter) (rest.Storage, rest.Storage, error) {
	st := strategy{ObjectTyper: Scheme, NameGenerator: names.SimpleNameGenerator, k: k}
	gr := k.gv.WithResource(k.resource).GroupResource()
	store := &genericregistry.Store{
		NewFunc:                   k.newObj,
		NewListFunc:               k.newList,
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: k.gv.WithResource(k.singular).GroupResource(),
		PredicateFunc: func(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
			return storage.SelectionPredicate{Label: label, Field: field, GetAttrs: k.getAttrs}
		},
		CreateStrategy:      st,
		UpdateStrategy:      st,
		DeleteStrategy:      st,
		ResetFieldsStrategy: st,
		TableConvertor:      tableConvertor(k, gr),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: k.getAttrs}); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", gr, err)
	}
	if !k.hasStatus {
		return &REST{Store: store, k: k}, nil, nil
	}
	statusStore := *store
	ss := statusStrategy{st}
	statusStore.CreateStrategy = nil
	statusStore.DeleteStrategy = nil
	statusStore.UpdateStrategy = ss
	statusStore.ResetFieldsStrategy = ss
	return &REST{Store: store, k: k}, &statusREST{store: &statusStore}, nil
}
