//! Images moved in and out of the daemon for staging: what layers the host has (by chain),
//! loading a staged image, erasing it, and saving a renter's image to an archive.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bollard::query_parameters::{
    ImportImageOptionsBuilder, ListImagesOptions, RemoveImageOptionsBuilder,
};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use gpux_protocol::ImageDigest;
use tokio::io::AsyncWriteExt;

use super::{ExecError, Executor, docker_err, is_status};

impl Executor {
    /// Every layer chain the daemon's images hold (chain ids, see `plane::stage`), leaving
    /// out the images in `skip`; and the images seen.
    pub async fn layer_chains(
        &self,
        skip: &BTreeSet<ImageDigest>,
    ) -> Result<BTreeSet<[u8; 32]>, ExecError> {
        let mut chains = BTreeSet::new();
        for image in self.list_images().await? {
            if skip.contains(&image) {
                continue;
            }
            let Some(diffs) = self.diff_ids(&image).await? else {
                continue;
            };
            chains.extend(crate::plane::chain_ids(&diffs));
        }
        Ok(chains)
    }

    /// An image's layers (diff ids, base first), or `None` when the daemon does not have it.
    pub async fn diff_ids(&self, image: &ImageDigest) -> Result<Option<Vec<[u8; 32]>>, ExecError> {
        let inspect = match self.docker.inspect_image(&image.to_string()).await {
            Ok(inspect) => inspect,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(docker_err("inspect image")(e)),
        };
        if inspect.id.as_deref() != Some(&*image.to_string()) {
            return Ok(None);
        }
        let layers = inspect
            .root_fs
            .and_then(|r| r.layers)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l.parse::<ImageDigest>().ok().map(|d| d.0))
            .collect();
        Ok(Some(layers))
    }

    /// The tags of the daemon's images (`repo:tag`, the ones an offer may list).
    pub async fn image_tags(&self) -> Result<BTreeMap<ImageDigest, Vec<String>>, ExecError> {
        let images = self
            .docker
            .list_images(None::<ListImagesOptions>)
            .await
            .map_err(docker_err("list images"))?;
        let mut tags: BTreeMap<ImageDigest, Vec<String>> = BTreeMap::new();
        for image in images {
            let Ok(id) = image.id.parse() else {
                continue;
            };
            let listed = image
                .repo_tags
                .into_iter()
                .filter(|t| t != "<none>:<none>" && gpux_protocol::is_image_tag(t));
            tags.entry(id).or_default().extend(listed);
        }
        Ok(tags)
    }

    /// Loads an image from a `docker save`-style tar streamed in (`docker load`).
    pub async fn load_image<S>(&self, tar: S) -> Result<(), ExecError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let options = ImportImageOptionsBuilder::default().quiet(true).build();
        let mut progress = std::pin::pin!(self.docker.import_image_stream(options, tar, None));
        while let Some(item) = progress.next().await {
            item.map_err(docker_err("load image"))?;
        }
        Ok(())
    }

    /// Erases an image and its layers no other image uses (gone already is fine). Refuses
    /// while a container uses it.
    pub async fn remove_image(&self, image: &ImageDigest) -> Result<(), ExecError> {
        let options = RemoveImageOptionsBuilder::default()
            .force(false)
            .noprune(false)
            .build();
        match self
            .docker
            .remove_image(&image.to_string(), Some(options), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(docker_err("remove image")(e)),
        }
    }

    /// The id of a local image by reference (tag, id or digest), if the daemon has it.
    pub async fn resolve_image(&self, reference: &str) -> Result<Option<ImageDigest>, ExecError> {
        match self.docker.inspect_image(reference).await {
            Ok(inspect) => Ok(inspect.id.and_then(|id| id.parse().ok())),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(docker_err("inspect image")(e)),
        }
    }

    /// A local image by reference: its id and the registry digests Docker knows it by
    /// (`repo@sha256:...`: where it was pulled from or pushed to), if the daemon has it.
    pub async fn image_origin(
        &self,
        reference: &str,
    ) -> Result<Option<(ImageDigest, Vec<String>)>, ExecError> {
        match self.docker.inspect_image(reference).await {
            Ok(inspect) => Ok(inspect
                .id
                .and_then(|id| id.parse().ok())
                .map(|id| (id, inspect.repo_digests.unwrap_or_default()))),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(docker_err("inspect image")(e)),
        }
    }

    /// Saves `image` (by id: no tags in the archive) to `path` (`docker save`).
    pub async fn save_image(&self, image: &ImageDigest, path: &Path) -> Result<(), ExecError> {
        let io = |source| ExecError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::create(path).await.map_err(io)?;
        let mut stream = std::pin::pin!(self.docker.export_image(&image.to_string()));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(docker_err("save image"))?;
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.flush().await.map_err(io)?;
        Ok(())
    }
}
