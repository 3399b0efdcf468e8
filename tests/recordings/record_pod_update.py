# Records tests/recordings/v1.28.7-raw/pod-update.json from a realk8s apiserver (../shared/realk8s):
#   REALK8S=<the folder build.sh made> python3 record_pod_update.py OUT.json
# (the admin token of its tokens.csv, its CA, the apiserver up.sh started on 127.0.0.1:6443)
import json, os, ssl, urllib.request, sys
D=os.environ.get('REALK8S','/work/realk8s')
TOK=open(D+'/tokens.csv').readline().split(',')[0]
ctx=ssl.create_default_context(cafile=D+'/pki/ca.crt')
B='https://127.0.0.1:6443'
def req(m,p,body=None,ct='application/json'):
    r=urllib.request.Request(B+p,method=m,data=None if body is None else json.dumps(body).encode(),headers={'Authorization':'Bearer '+TOK,'Content-Type':ct,'Accept':'application/json'})
    try:
        with urllib.request.urlopen(r,context=ctx) as f: return f.status, dict(f.headers), f.read()
    except urllib.error.HTTPError as e: return e.code, dict(e.headers), e.read()
out={}
print(req('POST','/api/v1/namespaces',{'apiVersion':'v1','kind':'Namespace','metadata':{'name':'rec-put'}})[0])
print(req('POST','/api/v1/namespaces/rec-put/serviceaccounts',{'apiVersion':'v1','kind':'ServiceAccount','metadata':{'name':'default'}})[0])
pod={"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"rec-put","labels":{"app":"bench"},"annotations":{"kube-watchcache.io/bench-seq":"1"}},
     "spec":{"nodeName":"node-0","containers":[{"name":"main","image":"registry.k8s.io/pause:3.9"}]}}
c,h,b=req('POST','/api/v1/namespaces/rec-put/pods',pod); print(c)
created=json.loads(b)
out['create']={'request':pod,'code':c,'body':created}
# the old writer: the pod as first sent, annotations stamped, RV of the stored object
old=json.loads(json.dumps(pod)); old['metadata']['annotations']['kube-watchcache.io/bench-seq']='2'; old['metadata']['resourceVersion']=created['metadata']['resourceVersion']
c,h,b=req('PUT','/api/v1/namespaces/rec-put/pods/p1',old); print(c, b[:300])
out['put_as_created']={'request':old,'code':c,'content_type':h.get('Content-Type'),'body':b.decode()}
# the stored pod with only the image changed: allowed
cur=json.loads(json.dumps(created)); cur['spec']['containers'][0]['image']='registry.k8s.io/pause:3.10'; cur['metadata']['annotations']['kube-watchcache.io/bench-seq']='3'
c,h,b=req('PUT','/api/v1/namespaces/rec-put/pods/p1',cur); print(c)
out['put_image_only']={'request':cur,'code':c,'body':json.loads(b)}
stored=json.loads(b)
# the stored pod with a label in a container env added: refused
bad=json.loads(json.dumps(stored)); bad['spec']['containers'][0]['env']=[{'name':'A','value':'b'}]
c,h,b=req('PUT','/api/v1/namespaces/rec-put/pods/p1',bad); print(c)
out['put_env_added']={'request':bad,'code':c,'body':b.decode()}
# merge patch of an annotation: allowed
c,h,b=req('PATCH','/api/v1/namespaces/rec-put/pods/p1',{'metadata':{'annotations':{'kube-watchcache.io/bench-seq':'4'}}},'application/merge-patch+json'); print(c)
out['merge_patch_annotation']={'code':c}
json.dump(out,open(sys.argv[1],'w'),indent=1)
