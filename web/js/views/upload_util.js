// Files picked with <input webkitdirectory>, with their paths inside the folder.

export function folderFiles(fileList) {
  return [...fileList].map((file) => ({ path: file.webkitRelativePath || file.name, file }));
}
