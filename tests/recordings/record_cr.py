# Records tests/recordings/v1.28.7-raw/cr-metadata.json from a realk8s apiserver (../shared/realk8s):
#   REALK8S=<the folder build.sh made> python3 record_cr.py OUT.json
import json, os, ssl, urllib.request, sys, time, threading
D=os.environ.get('REALK8S','/work/realk8s')
TOK=open(D+'/tokens.csv').readline().split(',')[0]
ctx=ssl.create_default_context(cafile=D+'/pki/ca.crt')
B='https://127.0.0.1:6443'
META_LIST="application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
META="application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
def req(m,p,body=None,accept='application/json',ct='application/json'):
    r=urllib.request.Request(B+p,method=m,data=None if body is None else json.dumps(body).encode(),headers={'Authorization':'Bearer '+TOK,'Content-Type':ct,'Accept':accept})
    try:
        with urllib.request.urlopen(r,context=ctx) as f: return f.status, f.headers.get('Content-Type'), f.read().decode()
    except urllib.error.HTTPError as e: return e.code, e.headers.get('Content-Type'), e.read().decode()
crd={"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.rec.example.com"},
 "spec":{"group":"rec.example.com","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget","listKind":"WidgetList"},
  "versions":[{"name":"v1","served":True,"storage":True,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":True}}}]}}
print(req('POST','/apis/apiextensions.k8s.io/v1/customresourcedefinitions',crd)[0])
print(req('POST','/api/v1/namespaces',{'metadata':{'name':'raw-cr2'}})[0])
time.sleep(3)
P='/apis/rec.example.com/v1/namespaces/raw-cr2/widgets'
out={'description':'custom resources: full JSON and metadata-only answers for the same object versions (kube-apiserver v1.28.7), recorded by record_cr.py','lists':{},'gets':[],'watch':{}}
c,_,b=req('GET',P); rv=json.loads(b)['metadata']['resourceVersion']
# watch both ways from rv, in threads
lines={'full':[], 'metadata':[]}
def w(kind, accept):
    r=urllib.request.Request(B+P+'?watch=1&resourceVersion=%s&timeoutSeconds=6'%rv,headers={'Authorization':'Bearer '+TOK,'Accept':accept})
    with urllib.request.urlopen(r,context=ctx) as f:
        lines[kind].append({'status':f.status,'content-type':f.headers.get('Content-Type')})
        for l in f: lines[kind].append(l.decode())
ts=[threading.Thread(target=w,args=('full','application/json')),threading.Thread(target=w,args=('metadata',META))]
[t.start() for t in ts]; time.sleep(1)
objs=[
 {"apiVersion":"rec.example.com/v1","kind":"Widget","metadata":{"name":"w-1","labels":{"app":"a","z":"q"},"annotations":{"note":"x<y\"z&>","b":"1"},"finalizers":["rec.example.com/f"]},"spec":{"size":1,"color":"red"}},
 {"apiVersion":"rec.example.com/v1","kind":"Widget","metadata":{"name":"w-2","generateName":"w-","ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"owner","uid":"0b7f4e2a-1111-2222-3333-444455556666","controller":True,"blockOwnerDeletion":True}]},"spec":{"n":[1,2]}},
]
for o in objs: print('create',req('POST',P,o)[0])
c,_,b=req('PATCH',P+'/w-1',{"metadata":{"annotations":{"patched":"yes"}}},ct='application/merge-patch+json'); print('patch',c)
c,_,b=req('DELETE',P+'/w-2'); print('delete',c)
for t in ts: t.join()
out['watch']={'path':P,'query':{'watch':'1','resourceVersion':rv,'timeoutSeconds':'6'},'full':lines['full'],'metadata':lines['metadata']}
for name in ['w-1']:
    s1,ct1,full=req('GET',P+'/'+name); s2,ct2,meta=req('GET',P+'/'+name,accept=META)
    out['gets'].append({'path':P+'/'+name,'full':{'status':s1,'content-type':ct1,'body':full},'metadata':{'status':s2,'content-type':ct2,'body':meta}})
s1,ct1,full=req('GET',P); s2,ct2,meta=req('GET',P,accept=META_LIST)
out['lists']={'path':P,'full':{'status':s1,'content-type':ct1,'body':full},'metadata':{'status':s2,'content-type':ct2,'body':meta}}
s,ct,b=req('GET','/apis/rec.example.com/v1/namespaces/raw-cr2-empty/widgets',accept=META_LIST)
out['empty_list']={'status':s,'content-type':ct,'body':b}
json.dump(out,open(sys.argv[1],'w'),indent=1)
