package main

// OpenAPI models for the core kinds. The generated OpenAPI definitions of the
// built-in kinds live in k8s.io/kubernetes, but client-go carries the same
// structure as a structured-merge-diff schema (for client-side apply
// configurations). Converting that schema back into OpenAPI gives real
// models: fields, list-map keys (containers merge by name under server-side
// apply) and atomic/granular maps, without descriptions or required lists.
// If that schema cannot be reached, every kind falls back to a permissive
// model (an object preserving unknown fields).

import (
	"reflect"
	"strings"
	"unsafe"

	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/applyconfigurations"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/structured-merge-diff/v6/schema"
	"sigs.k8s.io/structured-merge-diff/v6/typed"
)

// clientGoSchema returns client-go's built-in type schema. It is only
// reachable through applyconfigurations.NewTypeConverter (the package holding
// it is internal), so the parser is read out of the converter's private field.
func clientGoSchema() *schema.Schema {
	defer func() {
		if r := recover(); r != nil {
			klog.Warningf("client-go type schema unavailable (%v); serving permissive OpenAPI models", r)
		}
	}()
	tc := applyconfigurations.NewTypeConverter(runtime.NewScheme())
	v := reflect.ValueOf(tc)
	if v.Kind() == reflect.Ptr {
		v = v.Elem()
	}
	f := v.FieldByName("parser")
	if !f.IsValid() || f.Type() != reflect.TypeOf((*typed.Parser)(nil)) || f.IsNil() {
		klog.Warning("client-go type schema unavailable; serving permissive OpenAPI models")
		return nil
	}
	return &(*typed.Parser)(unsafe.Pointer(f.Pointer())).Schema
}

// getOpenAPIDefinitions serves both servers: apiextensions' generated models
// (CRD and meta types, which win on overlap) plus the core kinds.
func getOpenAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := map[string]common.OpenAPIDefinition{}
	if s := clientGoSchema(); s != nil {
		for _, td := range s.Types {
			if strings.HasPrefix(td.Name, "__") {
				continue
			}
			c := smdConverter{ref: ref, deps: map[string]bool{}}
			sch := c.namedAtom(td.Name, td.Atom)
			def := common.OpenAPIDefinition{Schema: *sch}
			for d := range c.deps {
				def.Dependencies = append(def.Dependencies, d)
			}
			defs[td.Name] = def
		}
	}
	// every served kind needs a model, even without the schema above
	for gvk := range namerScheme.AllKnownTypes() {
		name, err := namerScheme.ToOpenAPIDefinitionName(gvk)
		if err != nil {
			continue
		}
		if _, ok := defs[name]; !ok {
			defs[name] = common.OpenAPIDefinition{Schema: spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"object"}},
				VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}}}}
		}
	}
	for name, def := range generatedopenapi.GetOpenAPIDefinitions(ref) {
		defs[name] = def
	}
	return defs
}

type smdConverter struct {
	ref  common.ReferenceCallback
	deps map[string]bool
}

// namedAtom converts a top-level type; the untyped scalars get the schemas
// Kubernetes publishes for them.
func (c *smdConverter) namedAtom(name string, a schema.Atom) *spec.Schema {
	switch name {
	case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
		return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}, Format: "int-or-string"},
			VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-int-or-string": true}}}
	case "io.k8s.apimachinery.pkg.apis.meta.v1.Time":
		return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}, Format: "date-time"}}
	case "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime":
		return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}, Format: "date-time"}}
	case "io.k8s.apimachinery.pkg.api.resource.Quantity":
		// a number or a string; schemaconv special-cases this name as a scalar
		return &spec.Schema{VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-int-or-string": true}}}
	}
	return c.atom(a)
}

func (c *smdConverter) atom(a schema.Atom) *spec.Schema {
	switch {
	case a.Scalar != nil && a.List == nil && a.Map == nil:
		switch *a.Scalar {
		case schema.String:
			return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}}}
		case schema.Boolean:
			return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"boolean"}}}
		case schema.Numeric:
			return &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"number"}}}
		}
		return anything()
	case a.Scalar == nil && a.List != nil && a.Map == nil:
		l := a.List
		s := &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"array"},
			Items: &spec.SchemaOrArray{Schema: c.typeRef(l.ElementType)}}}
		switch {
		case l.ElementRelationship == schema.Associative && len(l.Keys) > 0:
			s.Extensions = spec.Extensions{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": l.Keys}
		case l.ElementRelationship == schema.Associative:
			s.Extensions = spec.Extensions{"x-kubernetes-list-type": "set"}
		default:
			s.Extensions = spec.Extensions{"x-kubernetes-list-type": "atomic"}
		}
		return s
	case a.Scalar == nil && a.List == nil && a.Map != nil:
		m := a.Map
		s := &spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"object"}}}
		if len(m.Fields) > 0 {
			s.Properties = map[string]spec.Schema{}
			for _, f := range m.Fields {
				s.Properties[f.Name] = *c.typeRef(f.Type)
			}
		}
		if m.ElementType.NamedType != nil || m.ElementType.Inlined != (schema.Atom{}) {
			s.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: c.typeRef(m.ElementType)}
		} else if len(m.Fields) == 0 {
			s.Extensions = spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}
		}
		if m.ElementRelationship == schema.Atomic {
			if s.Extensions == nil {
				s.Extensions = spec.Extensions{}
			}
			s.Extensions["x-kubernetes-map-type"] = "atomic"
		}
		return s
	}
	// untyped (scalar, list or map): anything goes
	return anything()
}

func anything() *spec.Schema {
	return &spec.Schema{VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}}}
}

func (c *smdConverter) typeRef(t schema.TypeRef) *spec.Schema {
	if t.NamedType == nil {
		s := c.atom(t.Inlined)
		if t.ElementRelationship != nil && *t.ElementRelationship == schema.Atomic && len(s.Type) > 0 && s.Type[0] == "object" {
			if s.Extensions == nil {
				s.Extensions = spec.Extensions{}
			}
			s.Extensions["x-kubernetes-map-type"] = "atomic"
		}
		return s
	}
	name := *t.NamedType
	if strings.HasPrefix(name, "__untyped") {
		return anything()
	}
	c.deps[name] = true
	r := spec.Schema{SchemaProps: spec.SchemaProps{Ref: c.ref(name)}}
	if t.ElementRelationship != nil && *t.ElementRelationship == schema.Atomic {
		// the relationship overrides the referenced type's: Kubernetes writes
		// this as a single-element allOf with the extension beside it
		return &spec.Schema{SchemaProps: spec.SchemaProps{AllOf: []spec.Schema{r}},
			VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-map-type": "atomic"}}}
	}
	return &r
}
